// The projections past one row against the CPU: StreamGemm's and StreamFfn's persistent launches
// (split-K partials, the FFN in one launch) and GemmRunner on cuBLASLt (heuristic and timed
// algorithms, in-situ candidates, split-K, tuning over layers). Without a CUDA device every test
// skips.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/cuda_test_util.h"
#include "tests/gpu_test_util.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"

namespace tailserve {
namespace {

using namespace testing;

// StreamGemm's k-chunk partials against the CPU: the cases of tests/kernel_cases/stream_gemm_cases.cc
// (each also checks the workspace is left zeroed for the next launch), then shapes it refuses.
TEST(CudaKernelTest, StreamGemmMatchesCpuOnOddSizes) {
  REQUIRE_GPU();
  for (const kernel_cases::CaseSpec& spec : kernel_cases::StreamGemmCases(83)) ExpectCaseMatches(spec);
  Dev<int> work(std::vector<int>(cuda::kStreamGemmWorkspaceBytes / sizeof(int), 0));
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

// GemmRunner tests share a runner over a 32 MB workspace (one per test).
class GemmRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    absl::StatusOr<TestGemm> made = MakeTestGemm();
    ASSERT_TRUE(made.ok()) << made.status();
    gemm_ = *std::move(made);
  }
  std::optional<TestGemm> gemm_;
};

// Past one row, projections go through cuBLASLt: with the heuristic's algorithm, and
// with the one timing picked (the timing runs accumulate into y when beta = 1, so y is reset).
// W also as a column slice of a wider matrix (ldw > k: one row goes to cuBLASLt then too).
TEST_F(GemmRunnerTest, MatchesCpu) {
  const unsigned seed = 78;
  std::mt19937 rng(seed);
  cuda::GemmRunner& runner = *gemm_->runner;
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
TEST_F(GemmRunnerTest, EveryCandidateMatchesCpu) {
  const unsigned seed = 91;
  std::mt19937 rng(seed);
  cuda::GemmRunner& runner = *gemm_->runner;
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
TEST_F(GemmRunnerTest, SplitKPartialsSumToTheProduct) {
  const unsigned seed = 79;
  std::mt19937 rng(seed);
  cuda::GemmRunner& runner = *gemm_->runner;
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
TEST_F(GemmRunnerTest, TunedOverLayersUsesTheGivenW) {
  const unsigned seed = 80;
  std::mt19937 rng(seed);
  cuda::GemmRunner& runner = *gemm_->runner;
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

}  // namespace
}  // namespace tailserve
