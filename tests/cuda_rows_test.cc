// Row kernels against the CPU on odd sizes: RMSNorm (with the residual adds), the mapped-memory
// copies, the embedding gather, SwiGLU and MoE routing, and the row kernels launched
// programmatically after a Gemv. Without a CUDA device every test skips.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda_test_util.h"
#include "tests/gpu_test_util.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/kernels/copy.h"
#include "worker/backends/cuda/kernels/gemv.h"
#include "worker/backends/cuda/kernels/partials.h"
#include "worker/backends/cuda/kernels/rope_kv.h"
#include "worker/backends/cuda/kernels/rows.h"

namespace tailserve {
namespace {

using namespace testing;

// RmsNormRows against the CPU: the cases of tests/kernel_cases/rms_norm_cases.cc (which the kernel
// bench also times).
TEST(CudaKernelTest, RmsNormMatchesCpuOnOddSizes) {
  REQUIRE_GPU();
  for (const kernel_cases::CaseSpec& spec : kernel_cases::RmsNormCases(1234)) ExpectCaseMatches(spec);
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

TEST(CudaKernelTest, SwiGluAndMoeRouteMatchCpu) {
  REQUIRE_GPU();
  // SwiGLU and the MoE rows against the CPU: the cases of tests/kernel_cases/row_cases.cc.
  for (const kernel_cases::CaseSpec& spec : kernel_cases::SwiGluCases(7)) ExpectCaseMatches(spec);
  for (const kernel_cases::CaseSpec& spec : kernel_cases::MoeRowCases(17)) ExpectCaseMatches(spec);
  std::mt19937 rng(7);
  const int rows = 19, ffn = 173, experts = 8, k = 2;
  // More arrays than the kernel adds: InvalidArgument, nothing launched.
  const size_t stride = (size_t(rows) * 2 * ffn + 3) / 4 * 4 + 4;
  Dev<float> dchunks(std::vector<float>(3 * stride));
  Dev<__half> out(size_t(rows) * ffn);
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

}  // namespace
}  // namespace tailserve
