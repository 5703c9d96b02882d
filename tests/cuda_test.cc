// GPU tests: each kernel against a CPU computation on odd sizes, then the whole CUDA engine against
// what HuggingFace transformers computes for the reference checkpoints. Without a CUDA device
// every test skips, saying so.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <algorithm>
#include <random>
#include <thread>
#include <tuple>
#include <utility>

#include "common/model/safetensors.h"
#include "tests/gpu_test_util.h"
#include "tests/reference_cases.h"
#include "tests/test_paths.h"
#include "worker/backends/cpu/cpu_engine.h"
#include "worker/backends/cuda/cuda_engine.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/device_info.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/copy.h"
#include "worker/backends/cuda/kernels/gemv.h"
#include "worker/backends/cuda/kernels/rope_kv.h"
#include "worker/backends/cuda/kernels/rows.h"
#include "worker/backends/cuda/kernels/sampling.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"

namespace tailserve {
namespace {

using testing::Margin;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)), cudaSuccess); }
  Dev(const std::vector<T>& host) : Dev(host.size()) { Put(host); }
  ~Dev() { cudaFree(p); }
  void Put(const std::vector<T>& host) { EXPECT_EQ(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> Get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Rounds v to fp16 in place (so a CPU reference uses the values the GPU reads); returns them as fp16.
std::vector<__half> RoundToHalf(std::vector<float>& v) {
  std::vector<__half> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2half(v[i]), v[i] = __half2float(h[i]);
  return h;
}

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

float F(__half v) { return __half2float(v); }

std::vector<float> ToFloats(const std::vector<__half>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = F(v[i]);
  return f;
}

// One k chunk's share of a split-K product, the reference for a partial: out[r, c] = Σ over
// i in [k0, k1) of a[r, i] · w[c, i] (a [rows, k], w [n, k]), and the same entries of a kernel's
// partial at `got` ([rows, n]), side by side for RelL2.
struct ChunkCheck {
  std::vector<float> want, mine;
};
ChunkCheck ChunkOfProduct(const std::vector<float>& a, const std::vector<__half>& w, int rows, int n, int k, int k0,
                          int k1, const float* got) {
  ChunkCheck c{std::vector<float>(size_t(rows) * n), std::vector<float>(size_t(rows) * n)};
  for (int r = 0; r < rows; ++r) {
    for (int col = 0; col < n; ++col) {
      double d = 0;
      for (int i = k0; i < k1; ++i) d += double(a[size_t(r) * k + i]) * __half2float(w[size_t(col) * k + i]);
      c.want[size_t(r) * n + col] = float(d);
      c.mine[size_t(r) * n + col] = got[size_t(r) * n + col];
    }
  }
  return c;
}

TEST(CudaKernelTest, RmsNormMatchesCpuOnOddSizes) {
  REQUIRE_GPU();
  const unsigned seed = 1234;
  std::mt19937 rng(seed);
  for (int rows : {1, 3, 19}) {
    for (int hidden : {64, 200, 203, 4096}) {  // 203: the scalar path (not whole float4s)
      for (int adds : {0, 1, 3}) {  // x += Σ adds arrays first, written back (stride past the rows)
        auto x = Random(size_t(rows) * hidden, rng, 3.0f);
        const int64_t stride = int64_t(x.size()) + 4;
        const auto w = Random(hidden, rng), add = Random(size_t(stride) * std::max(adds, 1), rng);
        Dev<float> dx(x), dw(w), dadd(add);
        Dev<__half> out(size_t(rows) * hidden);
        ASSERT_TRUE(cuda::RmsNormRows(dx.p, {adds ? dadd.p : nullptr, adds, stride}, nullptr, rows, hidden, dw.p, 1e-5f,
                                      out.p, nullptr)
                        .ok());
        for (int a = 0; a < adds; ++a) {
          for (size_t i = 0; i < x.size(); ++i) x[i] += add[a * stride + i];
        }
        std::vector<float> want(x.size());
        for (int r = 0; r < rows; ++r) {
          double ss = 0;
          for (int i = 0; i < hidden; ++i) ss += double(x[r * hidden + i]) * x[r * hidden + i];
          const double inv = 1 / std::sqrt(ss / hidden + 1e-5);
          for (int i = 0; i < hidden; ++i) want[r * hidden + i] = float(w[i] * x[r * hidden + i] * inv);
        }
        const std::string what = "rows " + std::to_string(rows) + " hidden " + std::to_string(hidden) + " adds " +
                                 std::to_string(adds) + " seed " + std::to_string(seed);
        EXPECT_LE(RelL2(ToFloats(out.Get()), want), 4e-3) << what;
        const auto got_x = dx.Get();  // the sum written back (or x untouched); the GPU adds in another order
        for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got_x[i], x[i], 1e-5f * (1 + std::abs(x[i]))) << what;
      }
    }
  }
}

// The decode graph's input and output copies: mapped pinned host memory to the device and back,
// lengths around the 16-byte pieces and past the grid's stride; unaligned pointers refused.
TEST(CudaKernelTest, CopyBytesThroughMappedHostMemory) {
  REQUIRE_GPU();
  const unsigned seed = 77;
  std::mt19937 rng(seed);
  const size_t most = 300007;
  absl::StatusOr<PinnedMemory> host = PinnedAlloc(most), back = PinnedAlloc(most + 1);  // + a guard byte
  ASSERT_TRUE(host.ok() && back.ok());
  absl::StatusOr<void*> mapped = MappedDevicePointer(*host), mapped_back = MappedDevicePointer(*back);
  ASSERT_TRUE(mapped.ok() && mapped_back.ok());
  auto* h = static_cast<unsigned char*>(host->get());
  auto* hb = static_cast<unsigned char*>(back->get());
  for (size_t i = 0; i < most; ++i) h[i] = static_cast<unsigned char>(rng());
  Dev<unsigned char> dev(most + 16);
  for (size_t bytes : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(4099), most}) {
    CUDA_OK(cudaMemset(dev.p, 0, most + 16));
    std::memset(hb, 0xAB, most + 1);
    ASSERT_TRUE(cuda::CopyBytes(*mapped, dev.p, bytes, nullptr).ok());
    ASSERT_TRUE(cuda::CopyBytes(dev.p, *mapped_back, bytes, nullptr).ok());
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(std::memcmp(h, hb, bytes), 0) << bytes << " bytes, seed " << seed;
    EXPECT_EQ(hb[bytes], 0xAB) << "wrote past " << bytes << " bytes";
  }
  EXPECT_EQ(cuda::CopyBytes(dev.p + 1, *mapped_back, 16, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The embedding gather with the batch-1 sums of squares: x holds the rows as floats, slot r gets
// row r's Σx², the slots after the rows (which later kernels accumulate into) are zeroed, whatever
// they held. Widths: 16-byte vectors (200), the scalar path (203), and vectors past one batch of
// loads a thread (8200: 1025 vectors over 256 threads).
TEST(CudaKernelTest, EmbedRowsWritesSumsOfSquaresAndClearsTheRest) {
  REQUIRE_GPU();
  const unsigned seed = 9;
  std::mt19937 rng(seed);
  const int vocab = 37, rows = 3, slots = 11;
  const std::vector<int32_t> tokens = {5, 36, 0};
  Dev<int32_t> dtok(tokens);
  std::vector<__half> table_h;
  std::vector<float> got, x_got;
  for (const int width : {203, 8200, 200}) {  // 200 last: the bad-argument check below reuses it
    const auto table = Random(size_t(vocab) * width, rng);
    table_h.assign(table.size(), __half());
    for (size_t i = 0; i < table.size(); ++i) table_h[i] = __float2half(table[i]);
    Dev<__half> dt(table_h);
    Dev<float> x(size_t(rows) * width), sumsq(std::vector<float>(slots, 7.0f));
    ASSERT_TRUE(cuda::EmbedRows({.table = dt.p, .tokens = dtok.p, .rows = rows, .hidden = width, .x = x.p,
                                 .sumsq = sumsq.p, .sumsq_slots = slots}, nullptr).ok());
    got = sumsq.Get(), x_got = x.Get();
    for (int r = 0; r < rows; ++r) {
      double want = 0;
      for (int i = 0; i < width; ++i) {
        const float v = __half2float(table_h[size_t(tokens[r]) * width + i]);
        want += double(v) * v;
        ASSERT_EQ(x_got[size_t(r) * width + i], v) << "width " << width << " row " << r << " column " << i;
      }
      EXPECT_NEAR(got[r], want, 1e-4 * want) << "width " << width << " row " << r << " seed " << seed;
    }
    for (int i = rows; i < slots; ++i) EXPECT_EQ(got[i], 0.0f) << "width " << width << " slot " << i;
  }
  const int hidden = 200;
  Dev<__half> dt(table_h);
  Dev<float> x(size_t(rows) * hidden);
  EXPECT_EQ(cuda::EmbedRows({.table = dt.p, .tokens = dtok.p, .rows = rows, .hidden = hidden, .x = x.p,
                             .sumsq_slots = slots}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);

}

// Every epilogue of the decode Gemv: plain, residual add + bias + output sum of squares, fused
// RMSNorm of an fp32 input, and SwiGLU over interleaved gate/up rows. n odd (a half-filled last
// column pair) except for SwiGLU.
TEST(CudaKernelTest, GemvMatchesCpuOnOddSizes) {
  REQUIRE_GPU();
  const unsigned seed = 77;
  std::mt19937 rng(seed);
  const float eps = 1e-5f;
  // k split 1, 2, 4 and 8 ways where n is small (the grid fits a wave; a lane keeps two steps of W
  // loads: 129, 257 and 512 16-byte vectors); n = 20001 overflows a wave of the H200 whatever the
  // split, which takes the finest such split (2 for k = 1032). The small grids run the deep
  // instances where a lane has 4 or more steps (batches of 4 and a ragged remainder), n = 20001
  // the 40-register ones.
  for (auto [k, n_odd] : {std::pair{200, 77}, {1032, 77}, {2056, 77}, {4096, 77}, {1032, 20001}}) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool residual = mode == 1, normed = mode >= 2, swiglu = mode == 3;
      const int n = swiglu ? n_odd + 1 : n_odd;
      auto xf = Random(size_t(k), rng), wf = Random(size_t(n) * k, rng, 0.05f), y0 = Random(size_t(n), rng);
      const auto bias = Random(size_t(n), rng);
      const std::vector<__half> wh = RoundToHalf(wf);
      const std::vector<__half> xh = normed ? std::vector<__half>(xf.size()) : RoundToHalf(xf);  // normed: fp32 x
      float in_ss = 0.0f;
      for (int i = 0; i < k; ++i) in_ss += xf[i] * xf[i];
      Dev<__half> dx(xh), dw(wh), dact(size_t(n) / 2);
      Dev<float> dxf(xf), dy(y0), dbias(bias), din(std::vector<float>{in_ss}), dout(std::vector<float>{0.0f});
      std::vector<float> want(y0.size()), want_act(size_t(n) / 2), want_ss{0.0f};
      const double inv = normed ? 1.0 / std::sqrt(in_ss / k + eps) : 1.0;
      for (int c = 0; c < n; ++c) {
        double d = 0;
        for (int i = 0; i < k; ++i) d += double(xf[i]) * wf[size_t(c) * k + i];
        d *= inv;
        if (residual) d += bias[c] + y0[c];
        want[c] = float(d);
        want_ss[0] += float(d * d);
      }
      for (int c = 0; swiglu && c < n / 2; ++c) {
        const double g = want[2 * c], u = want[2 * c + 1];
        want_act[c] = float(g / (1 + std::exp(-g)) * u);
      }
      // W's first loads through shared memory, or none; Gemv's k split, or each one forced.
      for (auto [preload, split] : {std::pair{false, 0}, {true, 0}, {false, 1}, {false, 2}, {true, 4}, {false, 8}}) {
        dy.Put(y0), dout.Put({0.0f});
        cuda::GemvArgs a{.k = k, .w = dw.p, .n = n, .preload_w = preload, .k_split = split};
        if (normed) a.x_f32 = dxf.p, a.in_sumsq = din.p, a.eps = eps;
        else a.x = dx.p;
        if (swiglu) a.swiglu_out = dact.p;
        else a.y = dy.p;
        if (residual) a.beta = 1.0f, a.bias = dbias.p, a.out_sumsq = dout.p;
        ASSERT_TRUE(cuda::Gemv(a, nullptr).ok());
        const std::string what = "n " + std::to_string(n) + " k " + std::to_string(k) + " mode " +
                                 std::to_string(mode) + " preload " + std::to_string(preload) + " k split " +
                                 std::to_string(split) + " seed " + std::to_string(seed);
        if (swiglu) {
          EXPECT_LE(RelL2(ToFloats(dact.Get()), want_act), 2e-3) << what;  // fp16 output
        } else {
          EXPECT_LE(RelL2(dy.Get(), want), 1e-5) << what;
        }
        if (residual) {
          EXPECT_LE(RelL2(dout.Get(), want_ss), 1e-5) << what;
        }
      }
    }
  }
  Dev<__half> dx(std::vector<__half>(8)), dw(std::vector<__half>(8));
  Dev<float> dy(std::vector<float>(1));
  EXPECT_EQ(cuda::Gemv({.x = dx.p, .k = 8, .w = dw.p, .n = 1, .y = dy.p, .k_split = 3}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// StreamGemm's k-chunk partials against the CPU on odd sizes: rows 1, 3 and 16 (its X tile is
// 16 rows, zero-filled past the real ones), n that leaves a part tile, 1 to 6 chunks; one workspace
// throughout, so each launch also checks that the previous one left its counters zeroed, and some
// launches use fewer CTAs than an SM count so that a CTA takes many items.
TEST(CudaKernelTest, StreamGemmMatchesCpuOnOddSizes) {
  REQUIRE_GPU();
  const unsigned seed = 83;
  std::mt19937 rng(seed);
  Dev<int> work(std::vector<int>(cuda::kStreamGemmWorkspaceBytes / sizeof(int), 0));
  for (auto [rows, n, k] : {std::tuple{1, 70, 384}, {3, 200, 384}, {16, 77, 768}, {16, 1000, 1536}, {5, 64, 64}}) {
    auto xf = Random(size_t(rows) * k, rng), wf = Random(size_t(n) * k, rng, 0.05f);
    const std::vector<__half> xh = RoundToHalf(xf), wh = RoundToHalf(wf);
    Dev<__half> dx(xh), dw(wh);
    for (int chunks : {1, 2, 3, 6}) {
      if (k % (64 * chunks) != 0) continue;
      // ring: the ring's bytes (0: all that fit); 1 asks for fewer than two stages and gets two.
      for (auto [ctas, variant, ring] : {std::tuple{0, 0, 0}, {7, 0, 0}, {0, 1, 0}, {0, 2, 0}, {7, 3, 0}, {0, 4, 0},
                                         {0, 1, 80 << 10}, {5, 0, 1}}) {
        if (k % (cuda::StreamGemmKStep(variant) * chunks) != 0) continue;
        const int64_t stride = int64_t(rows) * n + 4;  // not rows · n: the stride is what places a chunk
        Dev<float> dp(std::vector<float>(size_t(stride) * chunks, std::nanf("")));
        ASSERT_TRUE(cuda::StreamGemm({.x = dx.p, .rows = rows, .k = k, .w = dw.p, .n = n, .chunks = chunks,
                                      .partials = dp.p, .partial_stride = stride, .workspace = work.p, .ctas = ctas,
                                      .max_ring_bytes = ring, .variant = variant},
                                     nullptr)
                        .ok());
        const std::vector<float> got = dp.Get();
        const int kc = k / chunks;
        for (int c = 0; c < chunks; ++c) {
          // xf holds the fp16 values the kernel read (RoundToHalf rounds in place).
          const ChunkCheck cc = ChunkOfProduct(xf, wh, rows, n, k, c * kc, (c + 1) * kc, got.data() + c * stride);
          EXPECT_LE(RelL2(cc.mine, cc.want), 1e-5) << "rows " << rows << " n " << n << " k " << k << " chunk " << c
                                                   << " of " << chunks << " ctas " << ctas << " variant " << variant
                                                   << " ring " << ring << " seed " << seed;
        }
      }
    }
  }
  Dev<__half> dx(std::vector<__half>(16 * 96)), dw(std::vector<__half>(8 * 96));
  Dev<float> dp(std::vector<float>(16 * 8 * 2));
  EXPECT_EQ(cuda::StreamGemm({.x = dx.p, .rows = 1, .k = 96, .w = dw.p, .n = 8, .partials = dp.p, .workspace = work.p},
                             nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);  // k not a multiple of 64
  EXPECT_EQ(cuda::StreamGemm({.x = dx.p, .rows = 17, .k = 64, .w = dw.p, .n = 8, .partials = dp.p, .workspace = work.p},
                             nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// StreamFfn against the CPU: act = SwiGLU(x · W_gate_upᵀ) rounded to fp16 as the kernel writes
// it, and each down chunk's partial from the kernel's own act (so a wrong chunk, group count or
// order shows as an exact mismatch, not as rounding). Odd row counts, one, two and four k boxes a
// stage, equal chunks and last chunks of their own size, 1 to 16 chunks at lags 1 to past the last
// group, one CTA (a producer waiting on its own consumers' gate/up tiles), 3 CTAs and one an SM,
// and launched programmatically (X copies deferred behind the first W); one workspace throughout
// (counters reset).
TEST(CudaKernelTest, StreamFfnMatchesCpu) {
  REQUIRE_GPU();
  const unsigned seed = 89;
  std::mt19937 rng(seed);
  Dev<int> work(std::vector<int>(cuda::kStreamGemmWorkspaceBytes / sizeof(int), 0));
  // The last two elements: StreamFfnArgs::last_chunk (0: equal chunks) and last_chunks.
  for (auto [rows, h, f, chunks, lag, last, count] :
       {std::tuple{1, 192, 256, 4, 2, 0, 1}, {5, 256, 512, 2, 1, 0, 1}, {16, 128, 384, 3, 4, 0, 1},
        {16, 320, 640, 5, 2, 0, 1}, {13, 192, 1024, 8, 3, 0, 1}, {7, 128, 1024, 16, 5, 0, 1}, {3, 64, 128, 1, 2, 0, 1},
        {16, 512, 1024, 4, 3, 0, 1}, {16, 512, 1792, 4, 3, 256, 1}, {5, 256, 1152, 3, 2, 384, 1},
        {13, 192, 704, 4, 4, 128, 1}, {16, 512, 2560, 4, 3, 512, 2}, {11, 192, 1216, 4, 2, 128, 3}}) {
    auto xf = Random(size_t(rows) * h, rng), guf = Random(size_t(2) * f * h, rng, 0.1f),
         df = Random(size_t(h) * f, rng, 0.05f);
    const std::vector<__half> xh = RoundToHalf(xf), guh = RoundToHalf(guf), dh = RoundToHalf(df);
    Dev<__half> dx(xh), dgu(guh), dd(dh);
    std::vector<float> want_act(size_t(rows) * f);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < f; ++j) {
        double g = 0, u = 0;
        for (int i = 0; i < h; ++i) {
          const double xv = __half2float(xh[size_t(r) * h + i]);
          g += xv * __half2float(guh[size_t(2 * j) * h + i]), u += xv * __half2float(guh[size_t(2 * j + 1) * h + i]);
        }
        want_act[size_t(r) * f + j] = __half2float(__float2half(float(g / (1 + std::exp(-g)) * u)));
      }
    }
    // k_boxes 4 takes 4 boxes a stage where both k's are multiples of 256 (hidden 256 and 512 here).
    for (auto [ctas, overlap, k_boxes] : {std::tuple{0, false, 2}, {3, false, 2}, {1, false, 2}, {0, true, 2},
                                          {1, true, 2}, {0, false, 4}, {1, true, 4}}) {
      const int64_t stride = int64_t(rows) * h + 8;
      Dev<float> dp(std::vector<float>(size_t(stride) * chunks, std::nanf("")));
      Dev<__half> dact(std::vector<__half>(size_t(rows) * f, __float2half(std::nanf(""))));
      ASSERT_TRUE(cuda::StreamFfn({.x = dx.p, .rows = rows, .hidden = h, .w_gate_up = dgu.p, .ffn = f, .w_down = dd.p,
                                   .act = dact.p, .chunks = chunks, .lag = lag, .partials = dp.p,
                                   .partial_stride = stride, .workspace = work.p, .ctas = ctas,
                                   .overlap_previous = overlap, .k_boxes = k_boxes, .last_chunk = last,
                                   .last_chunks = count},
                                  nullptr)
                      .ok());
      const std::string where = "rows " + std::to_string(rows) + " hidden " + std::to_string(h) + " ffn " +
                                std::to_string(f) + " chunks " + std::to_string(chunks) + " lag " +
                                std::to_string(lag) + " ctas " + std::to_string(ctas) + " k boxes " +
                                std::to_string(k_boxes) + " last chunks " + std::to_string(count) + " of " +
                                std::to_string(last) +
                                (overlap ? " overlapped" : "") + " seed " + std::to_string(seed);
      const std::vector<float> act = ToFloats(dact.Get());
      EXPECT_LE(RelL2(act, want_act), 2e-3) << where;
      const std::vector<float> got = dp.Get();
      const int n_last = last > 0 ? count : 0, fc = (f - n_last * last) / (chunks - n_last);
      for (int c = 0, first = 0; c < chunks; ++c) {
        const int end = first + (c < chunks - n_last ? fc : last);
        const ChunkCheck cc = ChunkOfProduct(act, dh, rows, h, f, first, end, got.data() + c * stride);
        first = end;
        EXPECT_LE(RelL2(cc.mine, cc.want), 1e-5) << where << " chunk " << c;
      }
    }
  }
  Dev<__half> dx(std::vector<__half>(16 * 64)), dw(std::vector<__half>(2 * 96 * 64)), dact(std::vector<__half>(96));
  Dev<float> dp(std::vector<float>(64 * 2));
  EXPECT_EQ(cuda::StreamFfn({.x = dx.p, .rows = 1, .hidden = 64, .w_gate_up = dw.p, .ffn = 96, .w_down = dw.p,
                             .act = dact.p, .partials = dp.p, .partial_stride = 64, .workspace = work.p},
                            nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);  // ffn not a multiple of 64
  EXPECT_EQ(cuda::StreamFfn({.x = dx.p, .rows = 1, .hidden = 64, .w_gate_up = dw.p, .ffn = 64, .w_down = dw.p,
                             .act = dact.p, .chunks = 1, .partials = dp.p, .partial_stride = 64, .workspace = work.p,
                             .last_chunk = 32},
                            nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);  // a last chunk needs another chunk beside it
}

// A Gemv launched programmatically starts while its predecessor runs and must still read that
// predecessor's output: here a 100 MB gate/up Gemv writes the activations (reset to NaN before
// each round) that the overlapped down Gemv reads, ten times over (odd rounds copy W into shared
// memory before the wait).
TEST(CudaKernelTest, OverlappedGemvWaitsForItsPredecessor) {
  REQUIRE_GPU();
  const unsigned seed = 79;
  std::mt19937 rng(seed);
  const int k = 4096, f = 6144, n = 333;
  auto xf = Random(size_t(k), rng), w1f = Random(size_t(2 * f) * k, rng, 0.02f), w2f = Random(size_t(n) * f, rng, 0.05f);
  const auto y0 = Random(size_t(n), rng);
  Dev<__half> dx(RoundToHalf(xf)), dw1(RoundToHalf(w1f)), dw2(RoundToHalf(w2f)), dact{size_t(f)};
  Dev<float> dy(y0);
  absl::StatusOr<CudaStream> stream = MakeStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (int round = 0; round < 10; ++round) {
    dy.Put(y0);
    ASSERT_EQ(cudaMemsetAsync(dact.p, 0xff, size_t(f) * sizeof(__half), stream->get()), cudaSuccess);  // NaN
    ASSERT_TRUE(cuda::Gemv({.x = dx.p, .k = k, .w = dw1.p, .n = 2 * f, .swiglu_out = dact.p}, stream->get()).ok());
    ASSERT_TRUE(cuda::Gemv({.x = dact.p, .k = f, .w = dw2.p, .n = n, .y = dy.p, .beta = 1.0f, .overlap_previous = true,
                            .preload_w = round % 2 == 1},
                           stream->get()).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
    const std::vector<float> act = ToFloats(dact.Get());
    std::vector<float> want(n);
    for (int c = 0; c < n; ++c) {
      double d = y0[c];
      for (int i = 0; i < f; ++i) d += double(act[i]) * w2f[size_t(c) * f + i];
      want[c] = float(d);
    }
    EXPECT_LE(RelL2(dy.Get(), want), 1e-5) << "round " << round << " seed " << seed;
  }
}

// A GemmRunner on the default stream with a 32 MB cuBLASLt workspace of its own.
struct TestGemm {
  DeviceMemory workspace;
  std::unique_ptr<cuda::GemmRunner> runner;
};
absl::StatusOr<TestGemm> MakeTestGemm() {
  constexpr size_t kBytes = 32 << 20;
  absl::StatusOr<DeviceMemory> workspace = DeviceAlloc(kBytes);
  if (!workspace.ok()) return workspace.status();
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> runner = cuda::GemmRunner::Create(nullptr, workspace->get(), kBytes);
  if (!runner.ok()) return runner.status();
  return TestGemm{*std::move(workspace), *std::move(runner)};
}

// X·Wᵀ in double, rounded to float: x [rows, k], W's rows `ldw` elements apart from `w`.
std::vector<float> XWt(const std::vector<float>& x, const float* w, int rows, int k, int n, size_t ldw) {
  std::vector<float> out(size_t(rows) * n);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < n; ++c) {
      double d = 0;
      for (int i = 0; i < k; ++i) d += double(x[size_t(r) * k + i]) * w[c * ldw + i];
      out[size_t(r) * n + c] = float(d);
    }
  }
  return out;
}

// Past one row, projections go through cuBLASLt: with the heuristic's algorithm, and
// with the one timing picked (the timing runs accumulate into y when beta = 1, so y is reset).
// W also as a column slice of a wider matrix (ldw > k: one row goes to cuBLASLt then too).
TEST(CudaKernelTest, GemmRunnerMatchesCpu) {
  REQUIRE_GPU();
  const unsigned seed = 78;
  std::mt19937 rng(seed);
  absl::StatusOr<TestGemm> gemm = MakeTestGemm();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::GemmRunner& runner = *gemm->runner;
  for (bool tuning : {false, true}) {
    runner.set_tuning(tuning);
    for (int rows : {1, 3, 19, 64}) {  // 1: the Gemv
      for (float beta : {0.0f, 1.0f}) {
        for (int ldw : {0, 256}) {  // 256: columns [40, 240) of a 256-wide W
          const int k = 200, n = 77, stride = ldw ? ldw : k, first = ldw ? 40 : 0;
          auto xf = Random(size_t(rows) * k, rng), wf = Random(size_t(n) * stride, rng, 0.05f),
               y0 = Random(size_t(rows) * n, rng);
          Dev<__half> dx(RoundToHalf(xf)), dw(RoundToHalf(wf));
          Dev<float> dy(y0);
          ASSERT_TRUE(runner.Run(dx.p, rows, k, dw.p + first, n, beta, dy.p, ldw).ok());
          if (tuning && beta != 0.0f) {  // timed runs accumulated: run again on a fresh y
            dy.Put(y0);
            ASSERT_TRUE(runner.Run(dx.p, rows, k, dw.p + first, n, beta, dy.p, ldw).ok());
          }
          std::vector<float> want = XWt(xf, wf.data() + first, rows, k, n, stride);
          for (size_t i = 0; i < want.size(); ++i) want[i] += beta * y0[i];
          EXPECT_LE(RelL2(dy.Get(), want), 1e-5) << "rows " << rows << " beta " << beta << " ldw " << ldw << " tuning "
                                                  << tuning << " seed " << seed;
        }
      }
    }
  }
  // Rows 3, 19, 64 × beta 0, 1 × both ldw, and one row with ldw 256 × beta 0, 1: one row with
  // ldw = k takes the Gemv, untuned.
  EXPECT_EQ(runner.tuned_shapes(), 14);
  Dev<__half> dx(size_t(8)), dw(size_t(8));
  Dev<float> dy(size_t(8));
  EXPECT_EQ(runner.Run(dx.p, 2, 8, dw.p, 1, 0.0f, dy.p, 4).code(), absl::StatusCode::kInvalidArgument);
}

// In-situ tuning's handles: every candidate PrepareCandidates lists computes the same product, and
// the shapes listed are those of the rows asked for.
TEST(CudaKernelTest, GemmRunnerEveryCandidateMatchesCpu) {
  REQUIRE_GPU();
  const unsigned seed = 91;
  std::mt19937 rng(seed);
  absl::StatusOr<TestGemm> gemm = MakeTestGemm();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::GemmRunner& runner = *gemm->runner;
  const int rows = 19, k = 200, n = 77;
  auto xf = Random(size_t(rows) * k, rng), wf = Random(size_t(n) * k, rng, 0.05f);
  Dev<__half> dx(RoundToHalf(xf)), dw(RoundToHalf(wf));
  Dev<float> dy(size_t(rows) * n), other(size_t(3) * n);
  ASSERT_TRUE(runner.Run(dx.p, rows, k, dw.p, n, 0.0f, dy.p).ok());
  ASSERT_TRUE(runner.Run(dx.p, 3, k, dw.p, n, 0.0f, other.p).ok());
  const std::vector<float> want = XWt(xf, wf.data(), rows, k, n, k);
  const std::vector<cuda::GemmRunner::Plan*> shapes = runner.PlannedShapes(rows);
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(runner.PlannedShapes(5).size(), 0u);
  absl::StatusOr<int> count = runner.PrepareCandidates(shapes[0], 4);
  ASSERT_TRUE(count.ok()) << count.status();
  ASSERT_GE(*count, 1);
  EXPECT_LE(*count, 4);
  EXPECT_EQ(runner.UseCandidate(shapes[0], *count).code(), absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < *count; ++i) {
    ASSERT_TRUE(runner.UseCandidate(shapes[0], i).ok());
    dy.Put(std::vector<float>(dy.n, std::nanf("")));
    ASSERT_TRUE(runner.Run(dx.p, rows, k, dw.p, n, 0.0f, dy.p).ok());
    EXPECT_LE(RelL2(dy.Get(), want), 1e-5) << "candidate " << i << " of " << *count << " seed " << seed;
  }
}

// RunSplitK: k in chunks, each chunk's product an array `stride` floats apart whose sum is X·Wᵀ;
// a k the chunks would not split into whole 16-byte vectors falls back to one chunk.
TEST(CudaKernelTest, GemmRunnerSplitKPartialsSumToTheProduct) {
  REQUIRE_GPU();
  const unsigned seed = 79;
  std::mt19937 rng(seed);
  absl::StatusOr<TestGemm> gemm = MakeTestGemm();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::GemmRunner& runner = *gemm->runner;
  for (bool tuning : {false, true}) {
    runner.set_tuning(tuning);
    for (int rows : {1, 3, 19, 64}) {
      for (int splits : {1, 2, 3}) {
        for (int ldw : {0, 1000}) {  // 1000: columns [40, 40 + k) of a wider W
          for (int k : {240, 200}) {  // 200 / 2 = 100: not whole vectors, one chunk
            const int n = 77, wstride = ldw ? ldw : k, first = ldw ? 40 : 0;
            const int64_t stride = int64_t(rows) * n + 12;
            auto xf = Random(size_t(rows) * k, rng), wf = Random(size_t(n) * wstride, rng, 0.05f);
            Dev<__half> dx(RoundToHalf(xf)), dw(RoundToHalf(wf));
            Dev<float> dy(std::vector<float>(size_t(stride) * splits, std::nanf("")));
            absl::StatusOr<int> chunks = runner.RunSplitK(dx.p, rows, k, dw.p + first, n, splits, dy.p, stride, ldw);
            ASSERT_TRUE(chunks.ok()) << chunks.status();
            const bool whole = k % splits == 0 && (k / splits) % 8 == 0;
            EXPECT_EQ(*chunks, whole ? splits : 1) << "k " << k << " splits " << splits;
            const auto got = dy.Get();
            std::vector<float> sum(size_t(rows) * n, 0.0f);
            for (int c = 0; c < *chunks; ++c) {
              for (size_t i = 0; i < sum.size(); ++i) sum[i] += got[c * stride + i];
            }
            const std::vector<float> want = XWt(xf, wf.data() + first, rows, k, n, wstride);
            EXPECT_LE(RelL2(sum, want), 1e-5) << "rows " << rows << " k " << k << " splits " << splits << " ldw " << ldw
                                              << " tuning " << tuning << " seed " << seed;
          }
        }
      }
    }
  }
  Dev<__half> dx(size_t(64)), dw(size_t(64));
  Dev<float> dy(size_t(64));
  EXPECT_EQ(runner.RunSplitK(dx.p, 2, 16, dw.p, 2, 2, dy.p, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner.RunSplitK(dx.p, 2, 16, dw.p, 2, 0, dy.p, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

// Tuning over the layers (set_tuning_layers) times a first-layer W's counterparts in every
// layer, yet each call computes with the W it was given: here three layers, W a slice 40 columns
// into each, tuned on layer 0 (rotating) and then run on layers 0 and 2.
TEST(CudaKernelTest, GemmRunnerTunedOverLayersUsesTheGivenW) {
  REQUIRE_GPU();
  const unsigned seed = 80;
  std::mt19937 rng(seed);
  absl::StatusOr<TestGemm> gemm = MakeTestGemm();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::GemmRunner& runner = *gemm->runner;
  const int rows = 19, k = 200, n = 77, layers = 3;
  const size_t layer_elems = size_t(n) * k + 40;  // W's rows, then 40 elements of padding
  auto xf = Random(size_t(rows) * k, rng), wf = Random(layer_elems * layers, rng, 0.05f);
  Dev<__half> dx(RoundToHalf(xf)), dw(RoundToHalf(wf));
  runner.set_tuning_layers(dw.p, int64_t(layer_elems) * 2, layers);
  runner.set_tuning(true);
  for (int layer : {0, 2, 0}) {
    Dev<float> dy(std::vector<float>(size_t(rows) * n, std::nanf("")));
    ASSERT_TRUE(runner.Run(dx.p, rows, k, dw.p + layer * layer_elems, n, 0.0f, dy.p).ok());
    runner.set_tuning(false);
    const std::vector<float> want = XWt(xf, wf.data() + layer * layer_elems, rows, k, n, k);
    EXPECT_LE(RelL2(dy.Get(), want), 1e-5) << "layer " << layer << " seed " << seed;
  }
  EXPECT_EQ(runner.tuned_shapes(), 1);
}

TEST(CudaKernelTest, SwiGluAndMoeRouteMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  const int rows = 19, ffn = 173, experts = 8, k = 2;
  const auto gu = Random(size_t(rows) * 2 * ffn, rng, 2.0f);
  Dev<float> dgu(gu);
  Dev<__half> out(size_t(rows) * ffn);
  ASSERT_TRUE(cuda::SwiGlu(dgu.p, rows, ffn, out.p, nullptr).ok());
  std::vector<float> want(size_t(rows) * ffn);
  for (int r = 0; r < rows; ++r) {
    for (int f = 0; f < ffn; ++f) {
      const float g = gu[r * 2 * ffn + 2 * f], u = gu[r * 2 * ffn + 2 * f + 1];  // interleaved
      want[r * ffn + f] = g / (1 + std::exp(-g)) * u;
    }
  }
  EXPECT_LE(RelL2(ToFloats(out.Get()), want), 4e-3);
  // The same input as three split-K chunks that sum to it (odd total: the last output's path too).
  const size_t stride = (size_t(rows) * 2 * ffn + 3) / 4 * 4 + 4;  // 16-byte aligned arrays
  std::vector<float> chunks(3 * stride, std::nanf(""));
  for (size_t i = 0; i < gu.size(); ++i) {
    const float a = 0.25f * gu[i], b = -0.5f;
    chunks[i] = a, chunks[stride + i] = b, chunks[2 * stride + i] = gu[i] - a - b;
  }
  Dev<float> dchunks(chunks);
  ASSERT_TRUE(cuda::SwiGlu(nullptr, rows, ffn, out.p, nullptr, false,
                           {.data = dchunks.p, .count = 3, .stride = int64_t(stride)})
                  .ok());
  EXPECT_LE(RelL2(ToFloats(out.Get()), want), 4e-3);
  // More arrays than the kernel adds: InvalidArgument, nothing launched.
  EXPECT_EQ(cuda::SwiGlu(nullptr, rows, ffn, out.p, nullptr, false,
                         {.data = dchunks.p, .count = cuda::kMaxPartials + 1, .stride = int64_t(stride)})
                .code(),
            absl::StatusCode::kInvalidArgument);

  const auto logits = Random(size_t(rows) * experts, rng);
  Dev<float> dl(logits), dw(size_t(rows) * experts);
  ASSERT_TRUE(cuda::MoeRoute(dl.p, rows, experts, k, dw.p, nullptr).ok());
  const auto w = dw.Get();
  for (int r = 0; r < rows; ++r) {
    std::vector<int> order(experts);
    for (int e = 0; e < experts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[r * experts + a] > logits[r * experts + b]; });
    const double e0 = std::exp(logits[r * experts + order[0]]), e1 = std::exp(logits[r * experts + order[1]]);
    EXPECT_NEAR(w[r * experts + order[0]], e0 / (e0 + e1), 1e-5);
    EXPECT_NEAR(w[r * experts + order[1]], e1 / (e0 + e1), 1e-5);
    for (int j = 2; j < experts; ++j) EXPECT_EQ(w[r * experts + order[j]], 0.0f);
  }
}

// A small paged cache: `seqs` sequences with their own block-table rows, blocks handed out in a
// scrambled order so that pages are not contiguous.
struct PagedFixture {
  KvGeometry g;
  int blocks;
  std::vector<int32_t> table;
  Dev<char> k, v;
  Dev<float> ks, vs;
  PagedFixture(int seqs, int max_len, int kv_heads, int head_dim, KvDtype dtype)
      : g{16, kv_heads, head_dim, (max_len + 15) / 16, dtype},
        blocks(seqs * g.max_blocks_per_seq + 1),
        k(size_t(blocks) * 16 * kv_heads * head_dim * KvElementBytes(dtype)),
        v(k.n),
        ks(size_t(blocks) * 16 * kv_heads),
        vs(ks.n) {
    table.resize(size_t(seqs) * g.max_blocks_per_seq);
    for (size_t i = 0; i < table.size(); ++i) table[i] = 1 + int32_t((i * 7919) % table.size());
  }
  KvLayerView view() { return {k.p, v.p, ks.p, vs.p}; }
};

// Rotate-half RoPE of one head on the CPU.
void CpuRope(float* x, int hd, int pos, const std::vector<float>& inv) {
  for (int i = 0; i < hd / 2; ++i) {
    const float angle = float(pos) * inv[i];
    const float c = std::cos(angle), s = std::sin(angle), a = x[i], b = x[i + hd / 2];
    x[i] = a * c - b * s;
    x[i + hd / 2] = b * c + a * s;
  }
}

// Writes every row (sequence row_seq[r], position row_pos[r]) of qkv into f's cache through
// RopeWriteKv (no bias); returns qkv with its q heads rotated, as attention reads them.
std::vector<float> CacheRows(PagedFixture& f, const int32_t* dtable, const std::vector<float>& qkv,
                             const std::vector<int32_t>& row_seq, const std::vector<int32_t>& row_pos, int heads,
                             const std::vector<float>& inv, unsigned long long* clamps) {
  Dev<float> dqkv(qkv), dinv(inv);
  Dev<int32_t> dseq(row_seq), dpos(row_pos);
  EXPECT_TRUE(cuda::RopeWriteKv(dqkv.p, {}, nullptr, int(row_seq.size()), heads, {dseq.p, dpos.p, dtable}, f.g, f.view(),
                                dinv.p, clamps, nullptr)
                  .ok());
  return dqkv.Get();
}

// Poisons the FP8 cache at `slots` (every KV head): NaN bytes in both FP8 formats, NaN scales. A
// kernel that reads a poisoned slot instead of writing it first leaves NaN in its output.
void PoisonSlots(PagedFixture& f, const std::vector<int32_t>& slots) {
  const int kvh = f.g.kv_heads, hd = f.g.head_dim;
  for (int32_t slot : slots) {
    CUDA_OK(cudaMemset(f.k.p + size_t(slot) * kvh * hd, 0x7f, size_t(kvh) * hd));
    CUDA_OK(cudaMemset(f.v.p + size_t(slot) * kvh * hd, 0x7f, size_t(kvh) * hd));
    CUDA_OK(cudaMemset(f.ks.p + size_t(slot) * kvh, 0xff, size_t(kvh) * 4));
    CUDA_OK(cudaMemset(f.vs.p + size_t(slot) * kvh, 0xff, size_t(kvh) * 4));
  }
}

// What f's cache holds at `slots`, as floats: [slot][kv head][K, V][head_dim].
std::vector<float> SlotValues(PagedFixture& f, const std::vector<int32_t>& slots) {
  std::vector<float> out;
  Dev<float> head(f.g.head_dim);
  for (int32_t slot : slots) {
    for (int kh = 0; kh < f.g.kv_heads; ++kh) {
      for (int value = 0; value < 2; ++value) {
        EXPECT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, slot / 16, slot % 16, kh, head.p, nullptr).ok());
        const auto h = head.Get();
        out.insert(out.end(), h.begin(), h.end());
      }
    }
  }
  return out;
}

struct KvCase {
  int head_dim;
  KvDtype dtype;
  double tol;
  int group = 3;  // query heads per KV head: the tiled prefill kernel puts 16 / group tokens in a CTA
};

void PrintTo(const KvCase& c, std::ostream* os) {
  *os << KvDtypeName(c.dtype) << " head_dim " << c.head_dim << " group " << c.group;
}

// Above batch 1 the engine launches RMSNorm, RoPE and SwiGLU programmatically after the kernel
// before them. A Gemv lets its followers start as soon as it starts (gemv.cu), so each follower
// here would read the NaN written before the Gemv if it read anything before its wait.
TEST(CudaKernelTest, OverlappedRowKernelsWaitForTheirPredecessor) {
  REQUIRE_GPU();
  const unsigned seed = 81;
  std::mt19937 rng(seed);
  const int k = 4096, n = 12288, kv_heads = 2, heads = 4, hd = 64, pos = 37;
  auto xf = Random(size_t(k), rng), wf = Random(size_t(n) * k, rng, 0.02f);
  const auto xh = RoundToHalf(xf), wh = RoundToHalf(wf);
  std::vector<float> y(n);  // the Gemv's output, in double from the fp16 inputs
  for (int c = 0; c < n; ++c) {
    double d = 0;
    for (int i = 0; i < k; ++i) d += double(xf[i]) * wf[size_t(c) * k + i];
    y[c] = float(d);
  }
  Dev<__half> dx(xh), dw(wh), out{size_t(n)};
  Dev<float> dy{size_t(n)};
  PagedFixture f(1, 48, kv_heads, hd, KvDtype::kFp8E4M3);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / hd);
  Dev<float> dinv(inv);
  Dev<int32_t> dtable(f.table), dseq(std::vector<int32_t>{0}), dpos(std::vector<int32_t>{pos});
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  absl::StatusOr<CudaStream> stream = MakeStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  cudaStream_t s = stream->get();
  for (int round = 0; round < 9; ++round) {
    const int which = round % 3;  // RMSNorm over all n, SwiGLU over n / 2 pairs, RoPE of the first row of q/k/v heads
    ASSERT_EQ(cudaMemsetAsync(dy.p, 0xff, size_t(n) * 4, s), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(out.p, 0xff, size_t(n) * 2, s), cudaSuccess);
    ASSERT_TRUE(cuda::Gemv({.x = dx.p, .k = k, .w = dw.p, .n = n, .y = dy.p}, s).ok());
    std::vector<float> got, want;
    if (which == 0) {
      ASSERT_TRUE(cuda::RmsNormRows(dy.p, {}, nullptr, 1, n, nullptr, 1e-5f, out.p, s, true).ok());
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // s does not block with cudaMemcpy's stream
      double ss = 0;
      for (float v : y) ss += double(v) * v;
      for (float v : y) want.push_back(float(v / std::sqrt(ss / n + 1e-5)));
      got = ToFloats(out.Get());
    } else if (which == 1) {
      ASSERT_TRUE(cuda::SwiGlu(dy.p, 1, n / 2, out.p, s, true).ok());
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (int i = 0; i < n / 2; ++i) want.push_back(y[2 * i] / (1 + std::exp(-y[2 * i])) * y[2 * i + 1]);
      got = ToFloats(out.Get());
      got.resize(n / 2);
    } else {
      const RowMeta meta{dseq.p, dpos.p, dtable.p};
      ASSERT_TRUE(cuda::RopeWriteKv(dy.p, {}, nullptr, 1, heads, meta, f.g, f.view(), dinv.p, clamps.p, s, true).ok());
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      want.assign(y.begin(), y.begin() + heads * hd);
      for (int h = 0; h < heads; ++h) CpuRope(want.data() + h * hd, hd, pos, inv);
      got = dy.Get();
      got.resize(heads * hd);
    }
    EXPECT_LE(RelL2(got, want), 4e-3) << "round " << round << " seed " << seed;
  }
  EXPECT_EQ(clamps.Get()[0], 0u);
}

class CudaKvTest : public ::testing::TestWithParam<KvCase> {};

// Writes every position of 3 sequences (lengths across block boundaries) through RopeWriteKv, then
// checks q in place, the cache read back, and attention for every row against the CPU, both as
// decode rows and as prefill runs (tiles of 16 / group rows, two of them straddling sequences).
TEST_P(CudaKvTest, RopeCacheWriteAndAttentionMatchCpu) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  const unsigned seed = 99 + kc.head_dim;
  std::mt19937 rng(seed);
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim;
  const std::vector<int> lens = {1, 17, 40};
  PagedFixture f(int(lens.size()), 48, kv_heads, hd, kc.dtype);
  std::vector<int32_t> row_seq, row_pos;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int p = 0; p < lens[s]; ++p) row_seq.push_back(int32_t(s)), row_pos.push_back(p);
  }
  const int rows = int(row_seq.size()), width = (heads + 2 * kv_heads) * hd;
  const auto qkv = Random(size_t(rows) * width, rng, 2.0f), bias = Random(width, rng, 0.5f);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / hd);
  Dev<float> dqkv(qkv), dbias(bias), dinv(inv);
  Dev<int32_t> dseq(row_seq), dpos(row_pos), dtable(f.table);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  const RowMeta meta{dseq.p, dpos.p, dtable.p};
  ASSERT_TRUE(cuda::RopeWriteKv(dqkv.p, {}, dbias.p, rows, heads, meta, f.g, f.view(), dinv.p, clamps.p, nullptr).ok());
  const auto got_qkv = dqkv.Get();

  // CPU: bias, rotation; keys and values as the cache should hold them.
  std::vector<float> ref = qkv;
  for (int r = 0; r < rows; ++r) {
    float* x = ref.data() + size_t(r) * width;
    for (int i = 0; i < width; ++i) x[i] += bias[i];
    for (int h = 0; h < heads + kv_heads; ++h) CpuRope(x + h * hd, hd, row_pos[r], inv);
  }
  std::vector<float> q_got, q_want;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < heads * hd; ++i) q_got.push_back(got_qkv[size_t(r) * width + i]), q_want.push_back(ref[size_t(r) * width + i]);
  }
  EXPECT_LE(RelL2(q_got, q_want), 1e-5) << "seed " << seed;
  // Every row's cached K and V heads read back from a cache, in row, then KV-head order.
  Dev<float> head(hd);
  auto read_back = [&](PagedFixture& cache, std::vector<float>* k, std::vector<float>* v) {
    for (int r = 0; r < rows; ++r) {
      const int block = cache.table[size_t(row_seq[r]) * cache.g.max_blocks_per_seq + row_pos[r] / 16];
      for (int kh = 0; kh < kv_heads; ++kh) {
        for (int value = 0; value < 2; ++value) {
          ASSERT_TRUE(
              cuda::ReadKvForTest(cache.g, cache.view(), value, block, row_pos[r] % 16, kh, head.p, nullptr).ok());
          const auto h = head.Get();
          (value ? v : k)->insert((value ? v : k)->end(), h.begin(), h.end());
        }
      }
    }
  };
  std::vector<float> k_got, k_want, v_got, v_want;
  ASSERT_NO_FATAL_FAILURE(read_back(f, &k_got, &v_got));
  for (int r = 0; r < rows; ++r) {
    for (int kh = 0; kh < kv_heads; ++kh) {
      for (int value = 0; value < 2; ++value) {
        const float* want = ref.data() + size_t(r) * width + (heads + value * kv_heads + kh) * hd;
        (value ? v_want : k_want).insert((value ? v_want : k_want).end(), want, want + hd);
      }
    }
  }
  EXPECT_LE(RelL2(k_got, k_want), kc.tol) << KvDtypeName(kc.dtype) << " seed " << seed;
  EXPECT_LE(RelL2(v_got, v_want), kc.tol) << KvDtypeName(kc.dtype) << " seed " << seed;
  EXPECT_EQ(clamps.Get()[0], 0u);

  // The same q/k/v as a split-K projection's two partials, which RoPE sums (q to its own buffer),
  // into a second cache (same block table): the same q and K/V to rounding.
  {
    PagedFixture f2(int(lens.size()), 48, kv_heads, hd, kc.dtype);
    const int64_t stride = int64_t(rows) * width + 4;
    const auto p0 = Random(size_t(rows) * width, rng, 1.0f);
    std::vector<float> parts(size_t(2 * stride), std::nanf(""));
    for (size_t i = 0; i < p0.size(); ++i) parts[i] = p0[i], parts[size_t(stride) + i] = qkv[i] - p0[i];
    Dev<float> dparts(parts), dq(std::vector<float>(size_t(rows) * width, std::nanf("")));
    ASSERT_TRUE(cuda::RopeWriteKv(dq.p, {dparts.p, 2, stride}, dbias.p, rows, heads, meta, f2.g, f2.view(), dinv.p,
                                  clamps.p, nullptr)
                    .ok());
    const auto q2 = dq.Get();
    std::vector<float> q2_got, k2_got, v2_got;
    for (int r = 0; r < rows; ++r) {
      q2_got.insert(q2_got.end(), q2.begin() + size_t(r) * width, q2.begin() + size_t(r) * width + heads * hd);
    }
    ASSERT_NO_FATAL_FAILURE(read_back(f2, &k2_got, &v2_got));
    EXPECT_LE(RelL2(q2_got, q_want), 1e-5) << "partials, seed " << seed;
    EXPECT_LE(RelL2(k2_got, k_want), kc.tol) << "partials, " << KvDtypeName(kc.dtype) << " seed " << seed;
    EXPECT_LE(RelL2(v2_got, v_want), kc.tol) << "partials, " << KvDtypeName(kc.dtype) << " seed " << seed;
    EXPECT_EQ(clamps.Get()[0], 0u);
  }

  // Attention of every row over the cache as stored (quantisation is not counted against the
  // kernel), as decode rows and as prefill runs.
  for (int window : {0, 7}) {
    std::vector<float> want(size_t(rows) * heads * hd);
    for (int r = 0; r < rows; ++r) {
      const int lo = window ? std::max(0, row_pos[r] - window + 1) : 0;
      for (int h = 0; h < heads; ++h) {
        const int kh = h / (heads / kv_heads);
        const float* q = got_qkv.data() + size_t(r) * width + h * hd;
        std::vector<double> s;
        for (int p = lo; p <= row_pos[r]; ++p) {
          const int rr = r - (row_pos[r] - p);  // rows of a sequence are consecutive by position
          const float* kk = k_got.data() + (size_t(rr) * kv_heads + kh) * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(q[d]) * kk[d];
          s.push_back(dot / std::sqrt(double(hd)));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (int d = 0; d < hd; ++d) {
          double a = 0;
          for (size_t j = 0; j < s.size(); ++j) {
            const int rr = r - (row_pos[r] - (lo + int(j)));
            a += s[j] / z * v_got[(size_t(rr) * kv_heads + kh) * hd + d];
          }
          want[(size_t(r) * heads + h) * hd + d] = float(a);
        }
      }
    }
    // Splits merge with the combine kernel, or (decode, tensor cores, 2-16 splits) in a cluster;
    // decode on the tensor cores also in CTAs of 8 and 16 warps.
    for (int splits : {1, 3, 11, 16, 32}) {
      for (int mode = 0; mode < 3; ++mode) {  // decode, decode merged in a cluster, prefill runs
        const bool runs = mode == 2, cluster = mode == 1;
        if (cluster && (!cuda::AttentionTakesNewKv(f.g) || splits == 1 || splits > cuda::kMaxClusterSplits)) continue;
        for (int warps : {4, 8, 16}) {
          if (warps != 4 && (runs || !cuda::AttentionTakesNewKv(f.g))) continue;
          cuda::AttentionShape shape{.rows = rows, .heads = heads, .q_stride = width, .sliding_window = window,
                                     .splits = splits, .scale = 1.0f / std::sqrt(float(hd)), .runs = runs,
                                     .cluster_merge = cluster, .warps = warps};
          Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
          Dev<__half> out(size_t(rows) * heads * hd);
          ASSERT_TRUE(cuda::PagedAttention(dqkv.p, shape, meta, f.g, f.view(), ws.p, out.p, nullptr).ok());
          EXPECT_LE(RelL2(ToFloats(out.Get()), want), 4e-3) << "splits " << splits << " window " << window << " runs "
                                                            << runs << " cluster " << cluster << " warps " << warps
                                                            << " seed " << seed;
        }
      }
    }
    for (int warps : {2, 12, 32}) {  // refused: not a kernel instance
      const cuda::AttentionShape odd{.rows = rows, .heads = heads, .q_stride = width, .warps = warps};
      EXPECT_EQ(cuda::PagedAttention(dqkv.p, odd, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
                absl::StatusCode::kInvalidArgument) << "warps " << warps;
    }
    if (cuda::AttentionTakesNewKv(f.g)) {  // 8 and 16 warps decode only
      const cuda::AttentionShape wide_prefill{.rows = rows, .heads = heads, .q_stride = width, .runs = true, .warps = 16};
      EXPECT_EQ(cuda::PagedAttention(dqkv.p, wide_prefill, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
                absl::StatusCode::kInvalidArgument);
    }
    cuda::AttentionShape prefill_in_cluster{.rows = rows, .heads = heads, .q_stride = width, .splits = 3,
                                            .runs = true, .cluster_merge = true};
    EXPECT_EQ(cuda::PagedAttention(dqkv.p, prefill_in_cluster, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
    prefill_in_cluster.rows = 0;  // refused even with nothing to do
    EXPECT_EQ(cuda::PagedAttention(dqkv.p, prefill_in_cluster, meta, f.g, f.view(), nullptr, nullptr, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKvTest,
                         ::testing::Values(KvCase{64, KvDtype::kFp16, 1e-3}, KvCase{128, KvDtype::kFp16, 1e-3},
                                           KvCase{32, KvDtype::kFp8E4M3, 4e-2},
                                           KvCase{64, KvDtype::kFp8E4M3, 4e-2}, KvCase{128, KvDtype::kFp8E4M3, 4e-2},
                                           KvCase{128, KvDtype::kFp8E5M2, 8e-2},
                                           KvCase{128, KvDtype::kFp8E4M3, 4e-2, 4}, KvCase{64, KvDtype::kFp8E4M3, 4e-2, 8},
                                           KvCase{32, KvDtype::kFp8E5M2, 8e-2, 1}),
                         [](const auto& info) {
                           return std::string(KvDtypeName(info.param.dtype)) + "_hd" + std::to_string(info.param.head_dim) +
                                  "_g" + std::to_string(info.param.group);
                         });

// Batch-1 decode with RoPE in the q/k/v Gemv: a warp's columns are i and i + head_dim / 2 of a head,
// and the q and k heads leave rotated (after the bias); v heads only get the bias.
TEST(CudaKernelTest, GemvRopeRotatesQAndKHeads) {
  REQUIRE_GPU();
  const unsigned seed = 79;
  std::mt19937 rng(seed);
  const int heads = 3, kv_heads = 1, k = 520;
  for (int hd : {64, 128}) {
    for (int pos : {0, 37, 5000}) {
      const int n = (heads + 2 * kv_heads) * hd;
      auto xf = Random(size_t(k), rng), wf = Random(size_t(n) * k, rng, 0.05f);
      const auto bias = Random(size_t(n), rng);
      const std::vector<__half> wh = RoundToHalf(wf);
      std::vector<float> inv(hd / 2);
      for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(500000.0f, 2.0f * i / hd);
      float in_ss = 0.0f;
      for (float v : xf) in_ss += v * v;
      Dev<__half> dw(wh);
      Dev<float> dx(xf), dy{size_t(n)}, dbias(bias), din(std::vector<float>{in_ss}), dinv(inv);
      Dev<int32_t> dpos(std::vector<int32_t>{pos});
      ASSERT_TRUE(cuda::Gemv({.x_f32 = dx.p, .k = k, .w = dw.p, .n = n, .y = dy.p, .bias = dbias.p, .in_sumsq = din.p,
                              .eps = 1e-5f, .rope_head_dim = hd, .rope_cols = (heads + kv_heads) * hd,
                              .rope_pos = dpos.p, .rope_inv_freq = dinv.p},
                             nullptr)
                      .ok());
      std::vector<float> want(n);
      const double norm = 1.0 / std::sqrt(in_ss / k + 1e-5f);
      for (int c = 0; c < n; ++c) {
        double d = 0;
        for (int i = 0; i < k; ++i) d += double(xf[i]) * wf[size_t(c) * k + i];
        want[c] = float(d * norm + bias[c]);
      }
      for (int h = 0; h < heads + kv_heads; ++h) CpuRope(want.data() + h * hd, hd, pos, inv);
      EXPECT_LE(RelL2(dy.Get(), want), 1e-5) << "head_dim " << hd << " pos " << pos << " seed " << seed;
    }
  }
}

// Decode with new_kv (the batch-1 path): the rows' own K/V arrive rotated in the q rows while the
// cache holds poison (NaN bytes and scales) at their slots. The attention must equal attention over
// the cache RopeWriteKv wrote, and leave the cache holding what RopeWriteKv would have.
TEST_P(CudaKvTest, DecodeWithNewKvMatchesCachedAttention) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim;
  // 200: the writing warp's first tile loads before the wait and its stash lands in a later group.
  const std::vector<int> lens = {1, 17, 40, 200};
  PagedFixture f(int(lens.size()), 200, kv_heads, hd, kc.dtype);
  if (!cuda::AttentionTakesNewKv(f.g)) GTEST_SKIP() << "new_kv runs on the tensor-core (FP8) kernel only";
  const unsigned seed = 199 + kc.head_dim;
  std::mt19937 rng(seed);
  std::vector<int32_t> row_seq, row_pos;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int p = 0; p < lens[s]; ++p) row_seq.push_back(int32_t(s)), row_pos.push_back(p);
  }
  const int rows = int(row_seq.size()), width = (heads + 2 * kv_heads) * hd, seqs = int(lens.size());
  const auto qkv = Random(size_t(rows) * width, rng, 2.0f);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / hd);
  Dev<int32_t> dtable(f.table);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  const auto rotated = CacheRows(f, dtable.p, qkv, row_seq, row_pos, heads, inv, clamps.p);
  // Each sequence's last position as a decode row: q as RopeWriteKv left it, k and v as cached.
  std::vector<float> last(size_t(seqs) * width);
  std::vector<int32_t> last_seq(seqs), last_pos(seqs), slots(seqs);
  Dev<float> head(hd);
  for (int s = 0, r = -1; s < seqs; ++s) {
    r += lens[s];
    last_seq[s] = s, last_pos[s] = lens[s] - 1;
    std::copy_n(rotated.data() + size_t(r) * width, heads * hd, last.data() + size_t(s) * width);
    const int block = f.table[size_t(s) * f.g.max_blocks_per_seq + last_pos[s] / 16];
    slots[s] = block * 16 + last_pos[s] % 16;
    for (int kh = 0; kh < kv_heads; ++kh) {
      for (int value = 0; value < 2; ++value) {
        ASSERT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, block, last_pos[s] % 16, kh, head.p, nullptr).ok());
        const auto h = head.Get();
        std::copy(h.begin(), h.end(), last.data() + size_t(s) * width + (heads + value * kv_heads + kh) * hd);
      }
    }
  }
  Dev<float> dlast(last);
  Dev<int32_t> dlast_seq(last_seq), dlast_pos(last_pos);
  const RowMeta meta{dlast_seq.p, dlast_pos.p, dtable.p};
  // Each new_kv run merges as its reference does: 3, 11 and 16 splits in a cluster, 32 with the
  // combine kernel.
  // 16 and 8 warps a CTA: one split (the engine's batch 16 and 32) and 3 in a cluster.
  struct Run {
    int splits, window, warps = 4;
  };
  for (auto [splits, window, warps] : {Run{1, 0}, Run{3, 0}, Run{16, 0}, Run{32, 0}, Run{1, 37}, Run{3, 37}, Run{11, 37},
                                       Run{1, 0, 16}, Run{1, 37, 8}, Run{3, 0, 16}, Run{2, 37, 8}}) {
    cuda::AttentionShape shape{.rows = seqs, .heads = heads, .q_stride = width, .sliding_window = window,
                               .splits = splits, .scale = 1.0f / std::sqrt(float(hd)),
                               .cluster_merge = splits > 1 && splits <= cuda::kMaxClusterSplits, .warps = warps};
    Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
    Dev<__half> cached(size_t(seqs) * heads * hd), fresh(cached.n);
    ASSERT_TRUE(cuda::PagedAttention(dlast.p, shape, meta, f.g, f.view(), ws.p, cached.p, nullptr).ok());
    PoisonSlots(f, slots);
    shape.new_kv = true;
    ASSERT_TRUE(cuda::PagedAttention(dlast.p, shape, meta, f.g, f.view(), ws.p, fresh.p, nullptr, clamps.p).ok());
    const std::string what = std::string(KvDtypeName(kc.dtype)) + " splits " + std::to_string(splits) + " window " +
                             std::to_string(window) + " warps " + std::to_string(warps) + " seed " + std::to_string(seed);
    EXPECT_LE(RelL2(ToFloats(fresh.Get()), ToFloats(cached.Get())), 1e-3) << what;
    for (int s = 0; s < seqs; ++s) {
      for (int kh = 0; kh < kv_heads; ++kh) {
        for (int value = 0; value < 2; ++value) {
          const int block = slots[s] / 16;
          ASSERT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, block, slots[s] % 16, kh, head.p, nullptr).ok());
          const float* want = last.data() + size_t(s) * width + (heads + value * kv_heads + kh) * hd;
          EXPECT_LE(RelL2(head.Get(), std::vector<float>(want, want + hd)), 1e-6) << what << " seq " << s;
        }
      }
    }
  }
  EXPECT_EQ(clamps.Get()[0], 0u);
}

// Decode above batch 1 (shape.rope): each sequence's new position arrives as the q/k/v projection,
// unrotated and split into two partials plus a bias (or whole, without partials), while the cache
// holds poison at its slots. The attention must equal RopeWriteKv followed by the attention over
// the cache, and leave in the cache what RopeWriteKv writes.
TEST_P(CudaKvTest, DecodeWithRopeMatchesRopeWriteKv) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim;
  const std::vector<int> lens = {1, 17, 40, 200};
  PagedFixture f(int(lens.size()), 200, kv_heads, hd, kc.dtype);
  if (!cuda::AttentionTakesNewKv(f.g)) GTEST_SKIP() << "RoPE in the attention runs on the tensor-core (FP8) kernel only";
  const unsigned seed = 263 + kc.head_dim;
  std::mt19937 rng(seed);
  const int width = (heads + 2 * kv_heads) * hd, seqs = int(lens.size());
  // The cache: every position but each sequence's last.
  std::vector<int32_t> row_seq, row_pos;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int p = 0; p + 1 < lens[s]; ++p) row_seq.push_back(int32_t(s)), row_pos.push_back(p);
  }
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(500000.0f, 2.0f * i / hd);
  Dev<int32_t> dtable(f.table);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  CacheRows(f, dtable.p, Random(row_seq.size() * width, rng, 2.0f), row_seq, row_pos, heads, inv, clamps.p);
  // The last positions: the projection, its two partials, the bias.
  const auto whole = Random(size_t(seqs) * width, rng, 2.0f), bias = Random(size_t(width), rng, 0.5f);
  auto parts = Random(size_t(2) * seqs * width, rng, 2.0f);
  for (size_t i = 0; i < whole.size(); ++i) parts[whole.size() + i] = whole[i] - parts[i];
  std::vector<int32_t> last_seq(seqs), last_pos(seqs), slots(seqs);
  for (int s = 0; s < seqs; ++s) {
    last_seq[s] = s, last_pos[s] = lens[s] - 1;
    slots[s] = f.table[size_t(s) * f.g.max_blocks_per_seq + last_pos[s] / 16] * 16 + last_pos[s] % 16;
  }
  Dev<float> dparts(parts), dbias(bias), dinv(inv);
  Dev<int32_t> dlast_seq(last_seq), dlast_pos(last_pos);
  const RowMeta meta{dlast_seq.p, dlast_pos.p, dtable.p};
  auto slot_values = [&]() { return SlotValues(f, slots); };  // the last positions' cached K and V
  struct Run {
    int splits, window, warps, partials;
  };
  for (auto [splits, window, warps, partials] : {Run{1, 0, 4, 2}, Run{1, 0, 16, 2}, Run{1, 37, 8, 2}, Run{3, 0, 4, 2},
                                                 Run{32, 0, 4, 2}, Run{1, 0, 16, 0}, Run{2, 37, 8, 0}}) {
    // The projection as the kernels read it: the partials, or the whole in q's place.
    const cuda::Partials in = partials ? cuda::Partials{dparts.p, 2, int64_t(seqs) * width} : cuda::Partials{};
    Dev<float> dq(whole);
    cuda::AttentionShape shape{.rows = seqs, .heads = heads, .q_stride = width, .sliding_window = window,
                               .splits = splits, .scale = 1.0f / std::sqrt(float(hd)),
                               .cluster_merge = splits > 1 && splits <= cuda::kMaxClusterSplits, .warps = warps};
    Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
    Dev<__half> want(size_t(seqs) * heads * hd), got(want.n);
    PoisonSlots(f, slots);
    ASSERT_TRUE(cuda::RopeWriteKv(dq.p, in, dbias.p, seqs, heads, meta, f.g, f.view(), dinv.p, clamps.p, nullptr).ok());
    ASSERT_TRUE(cuda::PagedAttention(dq.p, shape, meta, f.g, f.view(), ws.p, want.p, nullptr).ok());
    const auto want_kv = slot_values();
    PoisonSlots(f, slots);
    dq.Put(whole);
    shape.new_kv = true, shape.rope = {.inv_freq = dinv.p, .parts = in, .bias = dbias.p};
    ASSERT_TRUE(cuda::PagedAttention(dq.p, shape, meta, f.g, f.view(), ws.p, got.p, nullptr, clamps.p).ok());
    const std::string what = std::string(KvDtypeName(kc.dtype)) + " splits " + std::to_string(splits) + " window " +
                             std::to_string(window) + " warps " + std::to_string(warps) + " partials " +
                             std::to_string(partials) + " seed " + std::to_string(seed);
    EXPECT_LE(RelL2(ToFloats(got.Get()), ToFloats(want.Get())), 1e-3) << what;
    // The same fp32 sums and angles, so the same bytes up to a contraction's rounding.
    EXPECT_LE(RelL2(slot_values(), want_kv), 1e-3) << what;
  }
  EXPECT_EQ(clamps.Get()[0], 0u);
  // RoPE in the attention needs new_kv.
  cuda::AttentionShape bad{.rows = seqs, .heads = heads, .q_stride = width, .scale = 1.0f,
                           .rope = {.inv_freq = dinv.p}};
  Dev<__half> out(size_t(seqs) * heads * hd);
  EXPECT_EQ(cuda::PagedAttention(dparts.p, bad, meta, f.g, f.view(), nullptr, out.p, nullptr, clamps.p).code(),
            absl::StatusCode::kInvalidArgument);
}

// The attention block in one launch against its parts: q/k/v on the CPU, PagedAttention with
// new_kv and RoPE, and o on the CPU added into x. At 5 and 16 rows (lengths across block
// boundaries), each launched twice on one workspace (the second sees the counters the first left).
TEST_P(CudaKvTest, AttentionBlockMatchesItsParts) {
  REQUIRE_GPU();
  const KvCase kc = GetParam();
  // hidden 1792: 7 q/k/v steps of 256, so every ring depth wraps.
  const int kv_heads = 2, heads = kc.group * kv_heads, hd = kc.head_dim, hidden = 1792;
  const int width = (heads + 2 * kv_heads) * hd, qd = heads * hd;
  {
    const KvGeometry g{16, kv_heads, hd, 13, kc.dtype};
    if (absl::Status takes = cuda::AttentionBlockTakes(5, hidden, heads, g, 0); !takes.ok()) {
      GTEST_SKIP() << takes.message();
    }
  }
  const unsigned seed = 577 + kc.head_dim + kc.group;
  std::mt19937 rng(seed);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = 1.0f / std::pow(500000.0f, 2.0f * i / hd);
  auto wqkv = Random(size_t(width) * hidden, rng, 1.0f / std::sqrt(float(hidden)));
  auto wo = Random(size_t(hidden) * qd, rng, 1.0f / std::sqrt(float(qd)));
  const auto bias = Random(size_t(width), rng, 0.5f);
  const auto wqkv_h = RoundToHalf(wqkv), wo_h = RoundToHalf(wo);
  Dev<__half> dwqkv(wqkv_h), dwo(wo_h);
  Dev<float> dbias(bias), dinv(inv);
  Dev<unsigned long long> clamps(1);
  CUDA_OK(cudaMemset(clamps.p, 0, 8));
  Dev<char> workspace(cuda::kAttentionBlockWorkspaceBytes);
  CUDA_OK(cudaMemset(workspace.p, 0, workspace.n));
  for (int seqs : {5, 16}) {
    // Row 1's 650 tokens: six rounds of the 8 warps' 16-key tiles, so four key stages wrap too. Row
    // 2's new key (position 379) falls in warp 7's third tile, at 4 key stages (head_dim 128) and at
    // 3 or 4 beside a 3-stage ring one of the extra stages in the aux buffer. Row 4's (position
    // 512, the benchmarks' case) opens warp 0's fifth tile, one more than any other warp's; row
    // 5's 545 (35 tiles) give warps 0-2 a fifth (with q/k/v given and two key stages, all three
    // copied early into aux); row 0's is its only key.
    std::vector<int> lens(seqs);
    for (int i = 0; i < seqs; ++i) {
      lens[i] = i == 1   ? 650
                : i == 2 ? 380
                : i == 4 ? 513
                : i == 5 ? 545
                         : 1 + (i * 37 + (i == 3 ? 100 : 0)) % 200;
    }
    PagedFixture f(seqs, 650, kv_heads, hd, kc.dtype);
    std::vector<int32_t> row_seq, row_pos;
    for (int sq = 0; sq < seqs; ++sq) {
      for (int p = 0; p + 1 < lens[sq]; ++p) row_seq.push_back(sq), row_pos.push_back(p);
    }
    Dev<int32_t> dtable(f.table);
    if (!row_seq.empty()) CacheRows(f, dtable.p, Random(row_seq.size() * width, rng, 2.0f), row_seq, row_pos, heads, inv, clamps.p);
    std::vector<int32_t> last_seq(seqs), last_pos(seqs), slots(seqs);
    for (int sq = 0; sq < seqs; ++sq) {
      last_seq[sq] = sq, last_pos[sq] = lens[sq] - 1;
      slots[sq] = f.table[size_t(sq) * f.g.max_blocks_per_seq + last_pos[sq] / 16] * 16 + last_pos[sq] % 16;
    }
    Dev<int32_t> dseq(last_seq), dpos(last_pos);
    const RowMeta meta{dseq.p, dpos.p, dtable.p};
    auto xn = Random(size_t(seqs) * hidden, rng);
    const auto xn_h = RoundToHalf(xn);
    const auto x0 = Random(size_t(seqs) * hidden, rng);
    Dev<__half> dxn(xn_h);
    auto slot_values = [&]() { return SlotValues(f, slots); };
    // The parts.
    Dev<float> dq(XWt(xn, wqkv.data(), seqs, hidden, width, hidden));
    cuda::AttentionShape shape{.rows = seqs, .heads = heads, .q_stride = width, .scale = 1.0f / std::sqrt(float(hd)),
                               .new_kv = true, .warps = 8, .rope = {.inv_freq = dinv.p, .bias = dbias.p}};
    Dev<float> attn_ws(cuda::AttentionWorkspaceFloats(shape, hd));
    Dev<__half> want_attn(size_t(seqs) * qd);
    PoisonSlots(f, slots);
    ASSERT_TRUE(cuda::PagedAttention(dq.p, shape, meta, f.g, f.view(), attn_ws.p, want_attn.p, nullptr, clamps.p).ok());
    const auto want_kv = slot_values();
    const auto want_a = ToFloats(want_attn.Get());
    auto want_x = XWt(want_a, wo.data(), seqs, qd, hidden, qd);
    for (size_t i = 0; i < want_x.size(); ++i) want_x[i] += x0[i];
    // The block, twice as the engine runs it, then with the kernel bench's knobs (shallower ring,
    // key tiles copied after q/k/v, one W box for a CTA's contiguous tiles), then with q/k/v given
    // as two partials that sum to the projection (xn, W_qkv and the scratch then unused: null),
    // also with the most key stages a ring of 2 and of 3 stages leaves room for, with o's ring
    // kept to its first stages (late o stages off), and with W_o's stream waiting for the key tiles.
    struct Knobs {
      int stages, early;
      bool wide, given = false, vector = true;
      int keys = 2;
      bool late = true, o_waits = false;
    };
    std::vector<float> halves(2 * dq.n);
    {
      const auto q = dq.Get();
      std::uniform_real_distribution<float> share(-0.5f, 1.5f);
      for (size_t i = 0; i < q.size(); ++i) halves[i] = q[i] * share(rng), halves[q.size() + i] = q[i] - halves[i];
    }
    Dev<float> qkv_halves(halves);
    const cuda::AttentionBlockArgs defaults{};
    const int most_stages = cuda::AttentionBlockMaxRingStages(hd, 0);
    EXPECT_EQ(most_stages, hd == 128 ? 6 : hd == 64 ? 5 : 4) << "the key buffers hold 2 / 1 / 0 ring stages";
    EXPECT_EQ(cuda::AttentionBlockMaxRingStages(hd, 1), 4);
    EXPECT_EQ(defaults.key_stages, 2);
    EXPECT_EQ(cuda::AttentionBlockMaxKeyStages(hd, 2), 4) << "a 2-stage ring leaves room for 4 key stages";
    EXPECT_EQ(cuda::AttentionBlockMaxKeyStages(hd, 3), hd == 128 ? 3 : 4);
    EXPECT_EQ(cuda::AttentionBlockMaxKeyStages(hd, 4), hd == 32 ? 3 : 2);
    const Knobs knobs[] = {{defaults.ring_stages, defaults.early_key_tiles, defaults.wide_boxes},
                           {defaults.ring_stages, defaults.early_key_tiles, defaults.wide_boxes},
                           {2, 0, true, false, false},
                           {3, 1, true},
                           {most_stages, 0, false},
                           {defaults.ring_stages, defaults.early_key_tiles, false, true},
                           {2, 0, false, true, false, 2, false},
                           {2, 2, false, true, true, cuda::AttentionBlockMaxKeyStages(hd, 2)},
                           {3, 1, false, true, false, cuda::AttentionBlockMaxKeyStages(hd, 3)},
                           {defaults.ring_stages, defaults.early_key_tiles, false, true, true, 2, false},
                           {defaults.ring_stages, defaults.early_key_tiles, false, true, true, 2, false, true},
                           {2, 0, false, true, true, cuda::AttentionBlockMaxKeyStages(hd, 2), true, true},
                           {defaults.ring_stages, defaults.early_key_tiles, false, false, true, 2, false, true},
                           {2, 0, false, false, true, 2, true},
                           {2, 2, false, true, true, cuda::AttentionBlockMaxKeyStages(hd, 2), true, true},
                           {3, 1, false, true, false, 2, true, false},
                           {2, 0, false, true, false, cuda::AttentionBlockMaxKeyStages(hd, 2), true, true}};
    for (int launch = 0; launch < static_cast<int>(std::size(knobs)); ++launch) {
      const Knobs k = knobs[launch];
      Dev<float> dx(x0), qkv_scratch(size_t(seqs) * width);
      Dev<__half> got_attn(size_t(seqs) * qd);
      PoisonSlots(f, slots);
      const absl::Status ran = cuda::AttentionBlock(
          {.xn = k.given ? nullptr : dxn.p, .rows = seqs, .hidden = hidden, .heads = heads,
           .w_qkv = k.given ? nullptr : dwqkv.p, .bias = dbias.p, .w_o = dwo.p, .inv_freq = dinv.p,
           .scale = 1.0f / std::sqrt(float(hd)), .meta = meta, .geometry = f.g, .layer = f.view(),
           .qkv = k.given ? nullptr : qkv_scratch.p,
           .qkv_parts = k.given ? cuda::Partials{qkv_halves.p, 2, int64_t(dq.n)} : cuda::Partials{}, .attn = got_attn.p,
           .x = dx.p, .clamps = clamps.p, .workspace = workspace.p, .ring_stages = k.stages,
           .early_key_tiles = k.early, .wide_boxes = k.wide, .vector_adds = k.vector, .key_stages = k.keys,
           .late_o_stages = k.late, .o_waits_for_keys = k.o_waits},
          nullptr);
      ASSERT_TRUE(ran.ok()) << ran;
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what = std::string(KvDtypeName(kc.dtype)) + " hd " + std::to_string(hd) + " group " +
                               std::to_string(kc.group) + " rows " + std::to_string(seqs) + " launch " +
                               std::to_string(launch) + " (stages " + std::to_string(k.stages) + ", early " +
                               std::to_string(k.early) + ", wide " + std::to_string(k.wide) + ", given " +
                               std::to_string(k.given) + ", vector adds " + std::to_string(k.vector) + ", key stages " +
                               std::to_string(k.keys) + ", late o stages " + std::to_string(k.late) +
                               ", o waits for keys " + std::to_string(k.o_waits) + ") seed " + std::to_string(seed);
      // q/k/v sum in another order than the CPU's, so a K or V byte can round the other way.
      EXPECT_LE(RelL2(ToFloats(got_attn.Get()), want_a), 5e-3) << what;
      EXPECT_LE(RelL2(slot_values(), want_kv), 1e-2) << what;
      EXPECT_LE(RelL2(dx.Get(), want_x), 5e-3) << what;
    }
    EXPECT_EQ(std::vector<char>(workspace.Get()), std::vector<char>(workspace.n, 0)) << "counters left zeroed";
    // Knobs out of range are refused before anything launches.
    for (const Knobs& bad : {Knobs{1, 2, false}, Knobs{defaults.ring_stages + 1, 1, false},
                             Knobs{most_stages + 1, 0, false}, Knobs{4, 3, false}, Knobs{2, 2, false, false, true, 3},
                             Knobs{2, 2, false, false, true, 1}}) {
      Dev<float> dx(x0), qkv_scratch(size_t(seqs) * width);
      Dev<__half> got_attn(size_t(seqs) * qd);
      const absl::Status refused =
          cuda::AttentionBlock({.xn = dxn.p, .rows = seqs, .hidden = hidden, .heads = heads, .w_qkv = dwqkv.p,
                                .bias = dbias.p, .w_o = dwo.p, .inv_freq = dinv.p, .scale = 1.0f,
                                .meta = meta, .geometry = f.g, .layer = f.view(), .qkv = qkv_scratch.p,
                                .attn = got_attn.p, .x = dx.p, .clamps = clamps.p, .workspace = workspace.p,
                                .ring_stages = bad.stages, .early_key_tiles = bad.early, .wide_boxes = bad.wide,
                                .key_stages = bad.keys},
                               nullptr);
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_EQ(dx.Get(), x0) << "nothing launched";
    }
    // Given q/k/v: more key stages than the ring leaves room for: refused.
    for (int ring : {2, 3, 4}) {
      Dev<float> dx(x0);
      Dev<__half> got_attn(size_t(seqs) * qd);
      const absl::Status refused = cuda::AttentionBlock(
          {.rows = seqs, .hidden = hidden, .heads = heads, .bias = dbias.p, .w_o = dwo.p, .inv_freq = dinv.p,
           .scale = 1.0f, .meta = meta, .geometry = f.g, .layer = f.view(),
           .qkv_parts = cuda::Partials{qkv_halves.p, 2, int64_t(dq.n)}, .attn = got_attn.p, .x = dx.p,
           .clamps = clamps.p, .workspace = workspace.p, .ring_stages = ring,
           .key_stages = cuda::AttentionBlockMaxKeyStages(hd, ring) + 1},
          nullptr);
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_EQ(dx.Get(), x0) << "nothing launched";
    }
    // Given q/k/v: too many partials, or partials closer than a whole [rows, width]: refused.
    for (const cuda::Partials& bad : {cuda::Partials{qkv_halves.p, cuda::kMaxPartials + 1, int64_t(dq.n)},
                                      cuda::Partials{qkv_halves.p, 2, int64_t(dq.n) - 1}}) {
      Dev<float> dx(x0);
      Dev<__half> got_attn(size_t(seqs) * qd);
      const absl::Status refused =
          cuda::AttentionBlock({.rows = seqs, .hidden = hidden, .heads = heads, .bias = dbias.p, .w_o = dwo.p,
                                .inv_freq = dinv.p, .scale = 1.0f, .meta = meta, .geometry = f.g, .layer = f.view(),
                                .qkv_parts = bad, .attn = got_attn.p, .x = dx.p, .clamps = clamps.p,
                                .workspace = workspace.p},
                               nullptr);
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_EQ(dx.Get(), x0) << "nothing launched";
    }
  }
  EXPECT_EQ(clamps.Get()[0], 0u);
  // More rows than a group has CTAs, or an fp16 cache: not taken.
  const KvGeometry g{16, kv_heads, hd, 13, kc.dtype};
  EXPECT_EQ(cuda::AttentionBlockTakes(17, hidden, heads, g, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::AttentionBlockTakes(4, hidden, heads, {16, kv_heads, hd, 13, KvDtype::kFp16}, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

// What f's cache holds for positions [0, len) of sequence row 0: [len][kv_heads][head_dim] floats
// (fp16, or E4M3 times its scale), K or V.
std::vector<float> CachedRows(PagedFixture& f, bool value, int len) {
  const std::vector<char> bytes = (value ? f.v : f.k).Get();
  const std::vector<float> scales = (value ? f.vs : f.ks).Get();
  const int kvh = f.g.kv_heads, hd = f.g.head_dim;
  std::vector<float> out(size_t(len) * kvh * hd);
  for (int p = 0; p < len; ++p) {
    const size_t slot = size_t(f.table[p / 16]) * 16 + p % 16;
    for (int kh = 0; kh < kvh; ++kh) {
      for (int d = 0; d < hd; ++d) {
        const size_t at = (slot * kvh + kh) * hd + d;
        float x;
        if (f.g.dtype == KvDtype::kFp16) {
          __half h;
          std::memcpy(&h, bytes.data() + 2 * at, 2);
          x = __half2float(h);
        } else {
          __nv_fp8_e4m3 e;
          e.__x = static_cast<__nv_fp8_storage_t>(bytes[at]);
          x = float(e) * scales[slot * kvh + kh];
        }
        out[(size_t(p) * kvh + kh) * hd + d] = x;
      }
    }
  }
  return out;
}

// One decode row over 8300 keys (519 scrambled blocks): on the tensor cores (E4M3) a single-split
// CTA streams 130 tiles a warp (33 in 16 warps), and the CUDA-core kernel (fp16) as many passes;
// 3 and 8 splits merge. Then the row at position 299 (300 keys) the same ways.
// The other attention tests stay under 48 keys.
TEST(CudaKernelTest, DecodeAttentionOverALongContext) {
  REQUIRE_GPU();
  const unsigned seed = 4242;
  const int kv_heads = 2, heads = 8, hd = 64, len = 8300, width = (heads + 2 * kv_heads) * hd;
  for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kFp8E4M3}) {
    std::mt19937 rng(seed);
    PagedFixture f(1, len, kv_heads, hd, dtype);
    std::vector<int32_t> row_seq(len, 0), row_pos(len);
    for (int p = 0; p < len; ++p) row_pos[p] = p;
    const auto qkv = Random(size_t(len) * width, rng, 1.0f);
    const std::vector<float> inv(hd / 2, 0.0f);  // angle 0: q and the cached k as qkv holds them
    Dev<int32_t> dtable(f.table);
    Dev<unsigned long long> clamps(1);
    CUDA_OK(cudaMemset(clamps.p, 0, 8));
    Dev<float> dqkv(CacheRows(f, dtable.p, qkv, row_seq, row_pos, heads, inv, clamps.p));
    const auto keys = CachedRows(f, false, len), values = CachedRows(f, true, len);
    // The last position, and position 299 (300 keys): 8 splits of 64 keys there give the fifth 44
    // keys (one of its four warps has no tile) and the last three none.
    for (int n : {len, 300}) {
      const float* q = qkv.data() + size_t(n - 1) * width;
      std::vector<float> want(size_t(heads) * hd);
      for (int h = 0; h < heads; ++h) {
        const int kh = h / (heads / kv_heads);
        std::vector<double> s(n);
        for (int p = 0; p < n; ++p) {
          const float* k = keys.data() + (size_t(p) * kv_heads + kh) * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(q[h * hd + d]) * k[d];
          s[p] = dot / std::sqrt(double(hd));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (int d = 0; d < hd; ++d) {
          double a = 0;
          for (int p = 0; p < n; ++p) a += s[p] / z * values[(size_t(p) * kv_heads + kh) * hd + d];
          want[size_t(h) * hd + d] = float(a);
        }
      }
      Dev<int32_t> last_seq(std::vector<int32_t>{0}), last_pos(std::vector<int32_t>{n - 1});
      for (auto [splits, warps] : {std::pair{1, 4}, {3, 4}, {8, 4}, {1, 16}}) {
        if (warps != 4 && !cuda::AttentionTakesNewKv(f.g)) continue;
        const cuda::AttentionShape shape{.rows = 1, .heads = heads, .q_stride = width, .splits = splits,
                                         .scale = 1.0f / std::sqrt(float(hd)), .warps = warps};
        Dev<float> ws(cuda::AttentionWorkspaceFloats(shape, hd));
        Dev<__half> out(size_t(heads) * hd);
        ASSERT_TRUE(cuda::PagedAttention(dqkv.p + size_t(n - 1) * width, shape, {last_seq.p, last_pos.p, dtable.p},
                                         f.g, f.view(), ws.p, out.p, nullptr)
                        .ok());
        EXPECT_LE(RelL2(ToFloats(out.Get()), want), 4e-3)
            << KvDtypeName(dtype) << " keys " << n << " splits " << splits << " warps " << warps << " seed " << seed;
      }
    }
  }
}

TEST(CudaKernelTest, KvWriteClampsNonFiniteValuesAndCountsThem) {
  REQUIRE_GPU();
  for (KvDtype dtype : {KvDtype::kFp8E4M3, KvDtype::kFp16}) {
    PagedFixture f(1, 16, 1, 64, dtype);
    const int width = 3 * 64;
    std::vector<float> qkv(width, 1.0f);
    qkv[64 + 3] = INFINITY;   // a key element
    qkv[128 + 5] = NAN;       // a value element
    qkv[128 + 6] = 1e6f;      // beyond fp16's range (fine for scaled fp8)
    std::vector<float> inv(32, 0.0f);
    Dev<float> dqkv(qkv), dinv(inv);
    Dev<int32_t> dseq(std::vector<int32_t>{0}), dpos(std::vector<int32_t>{0}), dtable(f.table);
    Dev<unsigned long long> clamps(1);
    CUDA_OK(cudaMemset(clamps.p, 0, 8));
    ASSERT_TRUE(cuda::RopeWriteKv(dqkv.p, {}, nullptr, 1, 1, {dseq.p, dpos.p, dtable.p}, f.g, f.view(), dinv.p, clamps.p,
                                  nullptr).ok());
    Dev<float> head(64);
    for (int value = 0; value < 2; ++value) {
      ASSERT_TRUE(cuda::ReadKvForTest(f.g, f.view(), value, f.table[0], 0, 0, head.p, nullptr).ok());
      for (float x : head.Get()) EXPECT_TRUE(std::isfinite(x)) << KvDtypeName(dtype);
    }
    // The key's inf also makes its rotation partner NaN (inf · sin 0): two key clamps, one for
    // the NaN value, and for fp16 one more for 1e6 (FP8 scales it into range).
    EXPECT_EQ(clamps.Get()[0], dtype == KvDtype::kFp16 ? 4u : 3u) << KvDtypeName(dtype);
  }
}

TEST(CudaKernelTest, SamplingGreedyTopKTopP) {
  REQUIRE_GPU();
  const int vocab = 50021;  // odd on purpose
  std::mt19937 rng(5);
  auto logits = Random(size_t(4) * vocab, rng);
  // Greedy: the lowest index of a tie, never NaN, also when the tie spans the CTAs a row's scan is
  // split over (40003 is in another CTA's part than 17).
  logits[17] = 9.0f, logits[vocab + 40000] = 9.0f, logits[vocab + 40001] = 8.9f;
  logits[40003] = 9.0f, logits[5] = std::nanf("");
  logits[vocab - 1] = 8.99f;                        // past the 16-byte vectors of row 0
  logits[2 * vocab + 7] = 30.0f;
  // Row 3 starts off a 16-byte boundary (scalar loads): a tie across parts, a NaN in front.
  logits[3 * vocab + 45001] = 9.5f, logits[3 * vocab + 45002] = 9.5f, logits[3 * vocab + 30] = 9.5f;
  logits[3 * vocab + 29] = std::nanf("");
  std::vector<cuda::SampleParams> p(4);
  p[0] = {};                                                     // greedy
  p[1] = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 2, .seed = 1, .position = 3};
  p[2] = {.temperature = 0.7f, .top_p = 0.5f, .top_k = 0, .seed = 2, .position = 9};
  p[3] = {.temperature = 0.8f, .top_k = 1};                      // top_k 1 is greedy too
  Dev<float> dl(logits);
  std::set<int32_t> second;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    p[1].seed = seed;
    Dev<cuda::SampleParams> dp(p);
    Dev<int32_t> out(4);
    ASSERT_TRUE(cuda::SampleRows(dl.p, 4, vocab, dp.p, out.p, nullptr).ok());
    const auto o = out.Get();
    EXPECT_EQ(o[0], 17);
    second.insert(o[1]);
    EXPECT_EQ(o[2], 7);  // one token holds nearly all the mass: top_p 0.5 keeps only it
    EXPECT_EQ(o[3], 30);
  }
  // One row alone takes the widest split (8 CTAs a row): the same picks.
  Dev<cuda::SampleParams> dp(std::vector<cuda::SampleParams>{p[0]});
  Dev<int32_t> out(1);
  ASSERT_TRUE(cuda::SampleRows(dl.p, 1, vocab, dp.p, out.p, nullptr).ok());
  EXPECT_EQ(out.Get()[0], 17);
  EXPECT_EQ(second, (std::set<int32_t>{40000, 40001}));
}

// The whole engine against transformers (../shared/reference). Two things are separated:
// what the KV format itself costs (the CPU backend in fp32 with the format emulated, a floor no
// kernel can beat) and what the CUDA kernels add on top of it.
struct EngineCase {
  std::string model;
  KvDtype dtype;
};

void PrintTo(const EngineCase& c, std::ostream* os) { *os << c.model << " " << KvDtypeName(c.dtype); }

class CudaEngineTest : public ::testing::TestWithParam<EngineCase> {};

TEST_P(CudaEngineTest, LogitsAndGreedyMatchTransformers) {
  REQUIRE_GPU();
  TAILSERVE_REQUIRE_SHARED();
  const EngineCase ec = GetParam();
  const bool fp8 = ec.dtype != KvDtype::kFp16;
  // The bounds: 1e-2 with FP16 KV, 3e-2 with FP8 (see the FP8 note below).
  const double tol = fp8 ? 3e-2 : 1e-2;
  // Router logit gaps below this (CPU, fp32) are near-ties the CUDA engine's fp16 activations
  // (relative error ~3e-3) may resolve the other way; those positions are reported, not compared.
  // With FP8 KV the two engines' hidden states differ more: an activation difference that moves
  // a value across an FP8 rounding boundary changes it by a whole FP8 step (6-12%).
  const float kRouterTie = fp8 ? 5e-2f : 1e-2f;
  const std::string dir = testing::ReferenceDir(ec.model);
  CudaEngineOptions o{.kv_dtype = ec.dtype, .kv_memory_fraction = 0.05, .prefill_chunk = 512, .logits_rows = 512};
  auto engine = CudaEngine::Load(dir, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto cpu = CpuEngine::Load(dir, {.kv_emulation = fp8 ? std::optional<KvDtype>(ec.dtype) : std::nullopt});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto expected = SafetensorsFile::Open(dir + "/expected_logits.safetensors");
  ASSERT_TRUE(expected.ok());
  const int64_t vocab = (*engine)->config().vocab_size;
  double worst = 0, worst_floor = 0, sum = 0, sum_floor = 0;
  int positions = 0, ties = 0, greedy_checked = 0;
  uint64_t cpu_id = 100;
  for (const testing::ReferenceCase& c : testing::LoadReferenceCases(dir)) {
    const std::vector<int32_t>& prompt = c.prompt;
    const std::vector<int32_t>& greedy = c.greedy;
    const std::vector<float>& margin = c.margin;
    std::vector<int32_t> all = c.tokens();
    const std::vector<float> want = testing::ExpectedLogits(**expected, c);
    std::vector<float> got, floor_logits;
    ASSERT_TRUE((*engine)->ForwardAllLogits(all, &got).ok());
    Sampling cpu_sampling;
    StepSequence cpu_seq{cpu_id++, &all, int32_t(prompt.size()), 0, &cpu_sampling};
    ASSERT_TRUE((*cpu)->Forward({&cpu_seq, 1}, /*all_positions=*/true, &floor_logits).ok());
    const std::vector<float> router_margin = (*cpu)->router_margins();
    (*cpu)->Release(cpu_seq.id);
    std::vector<bool> tie(all.size(), false);
    for (size_t p = 0; p < all.size(); ++p) {
      tie[p] = p < router_margin.size() && router_margin[p] < kRouterTie;
      const std::vector<float> g(got.begin() + p * vocab, got.begin() + (p + 1) * vocab);
      const std::vector<float> w(want.begin() + p * vocab, want.begin() + (p + 1) * vocab);
      const std::vector<float> f(floor_logits.begin() + p * vocab, floor_logits.begin() + (p + 1) * vocab);
      const double err = RelL2(g, w), floor = RelL2(f, w);
      if (tie[p]) {
        ++ties;
        std::printf("[ %s %s ] position %zu: router near-tie (gap %.2e), rel L2 %.3g not compared\n", ec.model.c_str(),
                    KvDtypeName(ec.dtype), p, router_margin[p], err);
        continue;
      }
      worst = std::max(worst, err), worst_floor = std::max(worst_floor, floor);
      sum += err, sum_floor += floor, ++positions;
      if (!fp8) {
        EXPECT_LE(err, tol) << ec.model << " position " << p;
      }
    }
    // Greedy through Step (prefill + the decode graph), teacher-forced on HF's tokens, wherever
    // HF's margin is clear and (FP8) the format itself keeps HF's token with a clear margin.
    std::vector<int32_t> tokens = prompt;
    Sampling s;
    for (size_t step = 0; step < greedy.size(); ++step) {
      StepSequence seq{7, &tokens, int32_t(prompt.size()), step == 0 ? 0 : int32_t(tokens.size()) - 1, &s};
      std::vector<int32_t> next;
      ASSERT_TRUE((*engine)->Step({&seq, 1}, &next).ok());
      const size_t p = prompt.size() + step - 1;
      const float* f = floor_logits.data() + p * vocab;
      const bool floor_keeps = std::max_element(f, f + vocab) - f == greedy[step] && Margin(f, vocab) >= 0.05f;
      if (margin[p] >= 0.05f && !tie[p] && (!fp8 || floor_keeps)) {
        EXPECT_EQ(next[0], greedy[step]) << ec.model << " step " << step;
        ++greedy_checked;
      }
      tokens.push_back(greedy[step]);
    }
    (*engine)->Release(7);
  }
  RecordProperty("worst_rel_l2", std::to_string(worst));
  std::printf("[ %s %s ] rel L2 to transformers: worst %.3g mean %.3g (bound %.0e); the format alone (CPU fp32 "
              "emulation): worst %.3g mean %.3g; %d positions, %d router near-ties skipped, %d greedy tokens checked\n",
              ec.model.c_str(), KvDtypeName(ec.dtype), worst, sum / positions, tol, worst_floor, sum_floor / positions,
              positions, ties, greedy_checked);
  if (fp8) {
    // FP8 E4M3 keeps 3 mantissa bits: each cached element carries up to 6% rounding error whatever
    // the scale, and these random-weight checkpoints amplify it to a worst 0.14-0.19 relative L2 in
    // fp32 (CpuEngine KvFormatEmulationError), above the 3e-2. What the kernels must show
    // is that they add little to what the format costs.
    EXPECT_LE(sum / positions, 1.2 * sum_floor / positions + 5e-3) << ec.model;
    EXPECT_LE(worst, 1.5 * worst_floor + 1e-2) << ec.model;
  }
  EXPECT_GT(greedy_checked, 20);
  EXPECT_GT((*engine)->stats()->graph_replays, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Reference, CudaEngineTest,
    ::testing::Values(EngineCase{"llama-gqa", KvDtype::kFp16}, EngineCase{"qwen2-bias-tied", KvDtype::kFp16},
                      EngineCase{"mixtral-moe", KvDtype::kFp16}, EngineCase{"llama-gqa", KvDtype::kFp8E4M3},
                      EngineCase{"qwen2-bias-tied", KvDtype::kFp8E4M3}, EngineCase{"mixtral-moe", KvDtype::kFp8E4M3}),
    [](const auto& info) {
      std::string n = info.param.model + "_" + KvDtypeName(info.param.dtype);
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

// The batch's FFN on one stream, and (halves: a size floor of 0) as two halves on two graph
// branches. Together the 19 rows take the split-K projections (partials summed by the attention and
// the norms); alone each row takes the batch-1 Gemv path. BlockAfterQkv: an FP8 cache, and the
// first 7 rows (a bucket of 8) run the attention and o as one AttentionBlock launch after
// cuBLASLt's q/k/v. StreamFfn: the FFN as one StreamFfn launch, on qwen2-bias-tied (llama-gqa's
// ffn 688 is not a multiple of 64), its q/k/v bias through the attention block, q/k/v by StreamGemm
// (hidden 192: one chunk), the norms before both letting them start before their wait, as the
// engine's default does. StreamQkv: BlockAfterQkv with q/k/v by StreamGemm in 4 chunks (hidden
// 256: one k box a stage), the block adding the 4 partials; Halves takes them too, the attention
// adding them (an FP16 cache).
enum BatchCase { kOneStream, kHalves, kBlockAfterQkv, kStreamFfn, kStreamQkv };
class CudaEngineBatchTest : public ::testing::TestWithParam<BatchCase> {};

TEST_P(CudaEngineBatchTest, BatchedDecodeEqualsAlone) {
  REQUIRE_GPU();
  TAILSERVE_REQUIRE_SHARED();
  const BatchCase mode = GetParam();
  const bool stream_ffn = mode == kStreamFfn;
  CudaEngineOptions options{.kv_dtype = mode >= kBlockAfterQkv ? KvDtype::kFp8E4M3 : KvDtype::kFp16,
                            .kv_memory_fraction = 0.05};
  cuda::DecodeTuning& t = options.tuning;
  t.ffn_halves_min_bytes = mode == kHalves ? 0 : std::numeric_limits<int64_t>::max();
  t.stream_min_rows = 2;
  t.stream_ffn_chunks = stream_ffn ? 4 : 0;
  t.stream_qkv_chunks = stream_ffn || mode == kStreamQkv || mode == kHalves ? 4 : 0;
  t.attention_block = mode >= kBlockAfterQkv;
  auto engine = CudaEngine::Load(testing::ReferenceDir(stream_ffn ? "qwen2-bias-tied" : "llama-gqa"), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // 19 sequences of different lengths decode 12 steps together, then each alone: same tokens.
  Sampling greedy;
  auto run = [&](std::vector<int> which, uint64_t id_base, bool replay) {
    std::vector<std::vector<int32_t>> toks;
    for (int w : which) {
      std::vector<int32_t> t;
      for (int i = 0; i < 3 + 5 * w; ++i) t.push_back((i * 31 + w * 7) % 1000);
      toks.push_back(t);
    }
    std::vector<int32_t> computed(which.size(), 0);
    for (int step = 0; step < 12; ++step) {
      std::vector<StepSequence> b;
      for (size_t i = 0; i < which.size(); ++i) {
        b.push_back({id_base + which[i], &toks[i], 0, computed[i], &greedy});
      }
      std::vector<int32_t> next;
      EXPECT_TRUE((*engine)->Step(b, &next).ok());
      for (size_t i = 0; i < which.size(); ++i) {
        toks[i].push_back(next[i]);
        computed[i] = int32_t(toks[i].size()) - 1;
      }
      if (replay && step == 5) {  // the benchmark's replays leave nothing behind
        for (bool from_idle : {false, true}) {
          absl::StatusOr<double> ms = (*engine)->ReplayMilliseconds(static_cast<int>(which.size()), 3, from_idle);
          EXPECT_TRUE(ms.ok()) << ms.status();
          if (ms.ok()) {
            EXPECT_GT(*ms, 0.0);
          }
        }
      }
    }
    for (int w : which) (*engine)->Release(id_base + w);
    return toks;
  };
  std::vector<int> all(19);
  for (int i = 0; i < 19; ++i) all[i] = i;
  const auto together = run(all, 1000, false);
  // The paths sum in different orders (cuBLASLt split-K or AttentionBlock against the batch-1
  // Gemv; with an FP8 cache a K or V byte then rounds the other way), so a greedy pick may flip
  // where the top two logits nearly tie, as the transformers test allows below a 0.05 margin;
  // anywhere else a differing token is a bug.
  auto expect_same = [&](const std::vector<int32_t>& alone, const std::vector<int32_t>& batched, int i) {
    ASSERT_EQ(alone.size(), batched.size());
    const size_t diverged = std::mismatch(alone.begin(), alone.end(), batched.begin()).first - alone.begin();
    if (diverged == alone.size()) return;
    std::vector<float> logits;
    ASSERT_TRUE((*engine)->ForwardAllLogits({batched.data(), diverged}, &logits).ok());
    const int64_t vocab = static_cast<int64_t>(logits.size() / diverged);
    const float margin = Margin(logits.data() + (diverged - 1) * vocab, vocab);
    std::printf("sequence %d: alone and batched differ at token %zu (top-2 logit margin %.4g)\n", i, diverged, margin);
    EXPECT_LT(margin, 0.05f) << "sequence " << i << " diverged at token " << diverged;
  };
  const auto first7 = run({0, 1, 2, 3, 4, 5, 6}, 3000, false);  // a bucket of 8: AttentionBlock where it is on
  for (int i = 0; i < 19; ++i) {
    const std::vector<int32_t> alone = run({i}, 5000, i % 2 == 1)[0];
    expect_same(alone, together[i], i);
    if (i < 7) expect_same(alone, first7[i], i);
  }
  const auto st = (*engine)->stats();
  EXPECT_EQ(st->kv_blocks_free, st->kv_blocks_total);  // everything released
  // Admission reserves whole sequences. Longer than the whole cache: INVALID_ARGUMENT (a router
  // would retry RESOURCE_EXHAUSTED forever); more than is free now: RESOURCE_EXHAUSTED until a
  // release gives the room back.
  const int64_t total = st->kv_blocks_total;
  EXPECT_EQ((*engine)->Reserve(1, (total + 1) * 16).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*engine)->Reserve(2, 100).ok());
  EXPECT_EQ((*engine)->stats()->kv_blocks_free, total - 7);  // ceil(100 / 16)
  EXPECT_EQ((*engine)->Reserve(3, total * 16).code(), absl::StatusCode::kResourceExhausted);
  (*engine)->Release(2);
  EXPECT_EQ((*engine)->stats()->kv_blocks_free, total);
  EXPECT_TRUE((*engine)->Reserve(3, total * 16).ok());
  (*engine)->Release(3);
  EXPECT_EQ((*engine)->stats()->kv_blocks_free, total);
}

// Tuning out of range is refused at load, before anything touches a GPU (so this runs without one).
TEST(CudaEngineOptionsTest, TuningOutOfRangeIsRefused) {
  TAILSERVE_REQUIRE_SHARED();
  std::vector<cuda::DecodeTuning> bad(5);
  bad[0].stream_min_rows = 1;
  bad[1].stream_qkv_chunks = -1;
  bad[2].stream_ffn_chunks = -1;
  bad[3].attention_splits = 0;
  bad[4].in_situ_candidates = 0;
  for (size_t i = 0; i < bad.size(); ++i) {
    auto engine = CudaEngine::Load(testing::ReferenceDir("qwen2-bias-tied"), {.tuning = bad[i]});
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << "case " << i << ": " << engine.status();
  }
}

std::string BatchCaseName(const ::testing::TestParamInfo<BatchCase>& info) {
  static const char* kNames[] = {"OneStream", "Halves", "BlockAfterQkv", "StreamFfn", "StreamQkv"};
  return kNames[info.param];
}
INSTANTIATE_TEST_SUITE_P(Ffn, CudaEngineBatchTest,
                         ::testing::Values(kOneStream, kHalves, kBlockAfterQkv, kStreamFfn, kStreamQkv),
                         BatchCaseName);

// The worker loads the engine on its main thread and steps it on the scheduler's, and the current
// CUDA device is per thread: an engine on device 1 must make it current itself.
TEST(CudaEngineDeviceTest, StepsFromAnotherThreadOnTheSecondGpu) {
  REQUIRE_GPU();
  TAILSERVE_REQUIRE_SHARED();
  if (ListCudaDevices()->size() < 2) GTEST_SKIP() << "needs two CUDA devices: the engine on device 1, stepped from a thread on device 0";
  auto engine = CudaEngine::Load(testing::ReferenceDir("llama-gqa"),
                                 {.kv_dtype = KvDtype::kFp16, .kv_memory_fraction = 0.05, .device = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Sampling greedy;
  auto generate = [&](uint64_t id) {
    std::vector<int32_t> toks = {5, 17, 300, 42};
    for (int step = 0; step < 6; ++step) {
      StepSequence s{id, &toks, 4, static_cast<int32_t>(toks.size()) - (step == 0 ? 4 : 1), &greedy};
      std::vector<int32_t> next;
      if (absl::Status st = (*engine)->Step({&s, 1}, &next); !st.ok()) {
        ADD_FAILURE() << st;
        break;
      }
      toks.push_back(next[0]);
    }
    (*engine)->Release(id);
    return toks;
  };
  std::vector<int32_t> elsewhere;
  std::thread other([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    elsewhere = generate(1);
  });
  other.join();
  EXPECT_EQ(elsewhere, generate(2));  // and the same tokens as on the loading thread
  EXPECT_EQ(elsewhere.size(), 10u);
}

}  // namespace
}  // namespace tailserve
