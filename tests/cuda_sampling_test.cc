// The sampling kernel: greedy ties and NaNs across the CTAs a row's scan is split over, top-k,
// top-p. Without a CUDA device the test skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "tests/cuda_test_util.h"
#include "tests/gpu_test_util.h"
#include "worker/backends/cuda/kernels/logprobs.h"
#include "worker/backends/cuda/kernels/sampling.h"
#include "worker/engine/sampling.h"

namespace tailserve {
namespace {

using namespace testing;

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

// LogprobRows against ComputeLogprobs (fp64 sums) on an odd vocabulary: no alternatives, some,
// all 20, a row that does not ask (left untouched), ties across threads, NaN and -inf, a row with
// fewer finite logits than asked, and a row not on a 16-byte boundary.
TEST(CudaKernelTest, LogprobsMatchTheCpu) {
  REQUIRE_GPU();
  const int vocab = 50021, rows = 6;
  std::mt19937 rng(11);
  auto logits = Random(size_t(rows) * vocab, rng);
  for (float& l : logits) l *= 8.0f;  // a peaked distribution, as real logits are
  const float nan = std::nanf(""), inf = INFINITY;
  logits[2 * vocab + 100] = 20.0f, logits[2 * vocab + 49000] = 20.0f, logits[2 * vocab + 7] = nan;
  logits[2 * vocab + 8] = -inf, logits[2 * vocab + 9] = 19.5f;
  for (int i = 0; i < vocab; ++i) logits[4 * vocab + i] = i % 997 == 0 ? float(i % 5) : -inf;  // 51 finite
  const std::vector<int> want = {1, 6, 21, 0, 21, 4};  // 1 + alternatives; 0: not asked
  const std::vector<int32_t> sampled = {3, 49999, 100, 5, 997, vocab - 1};
  std::vector<cuda::SampleParams> p(rows);
  for (int r = 0; r < rows; ++r) p[r].logprobs = want[r];
  Dev<float> dl(logits);
  Dev<cuda::SampleParams> dp(p);
  Dev<int32_t> ds(sampled);
  std::vector<cuda::RowLogprobs> sentinel(rows);
  for (auto& s : sentinel) s.count = -7;
  Dev<cuda::RowLogprobs> out(sentinel);
  ASSERT_TRUE(cuda::LogprobRows(dl.p, rows, vocab, dp.p, ds.p, out.p, nullptr).ok());
  const auto o = out.Get();
  for (int r = 0; r < rows; ++r) {
    if (want[r] == 0) {
      EXPECT_EQ(o[r].count, -7) << "row " << r << " did not ask";
      continue;
    }
    TokenLogprobs ref;
    ComputeLogprobs(std::span<const float>(logits.data() + size_t(r) * vocab, vocab), sampled[r], want[r] - 1, &ref);
    EXPECT_NEAR(o[r].logprob, ref.logprob, 2e-4 * std::max(1.0f, std::abs(ref.logprob))) << "row " << r;
    ASSERT_EQ(o[r].count, static_cast<int>(ref.top.size())) << "row " << r;
    for (int k = 0; k < o[r].count; ++k) {
      EXPECT_EQ(o[r].ids[k], ref.top[k].first) << "row " << r << " rank " << k;
      EXPECT_NEAR(o[r].values[k], ref.top[k].second, 2e-4 * std::max(1.0f, std::abs(ref.top[k].second)));
    }
  }
  EXPECT_EQ(o[2].ids[0], 100);  // the tie at 20.0 across threads: the lower id first
  EXPECT_EQ(o[2].ids[1], 49000);
  EXPECT_EQ(o[4].count, 20);
}

// What the op costs in a decode step (printed, not asserted): 64 rows of a 128,256-token
// vocabulary when no row asks (the op sits in every decode graph), and when all ask for 20.
TEST(CudaKernelTest, LogprobsCost) {
  REQUIRE_GPU();
  const int vocab = 128256, rows = 64;
  std::mt19937 rng(3);
  Dev<float> dl(Random(size_t(rows) * vocab, rng));
  Dev<int32_t> ds(std::vector<int32_t>(rows, 11));
  Dev<cuda::RowLogprobs> out(rows);
  for (int want : {0, 1, 21}) {
    std::vector<cuda::SampleParams> p(rows);
    for (auto& q : p) q.logprobs = want;
    Dev<cuda::SampleParams> dp(p);
    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    const int reps = 50;
    ASSERT_TRUE(cuda::LogprobRows(dl.p, rows, vocab, dp.p, ds.p, out.p, nullptr).ok());
    CUDA_OK(cudaEventRecord(start));
    for (int i = 0; i < reps; ++i) ASSERT_TRUE(cuda::LogprobRows(dl.p, rows, vocab, dp.p, ds.p, out.p, nullptr).ok());
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("logprobs op, %d rows x %d vocab, logprobs=%d: %.1f us\n", rows, vocab, want, 1000.0 * ms / reps);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
}

}  // namespace
}  // namespace tailserve
