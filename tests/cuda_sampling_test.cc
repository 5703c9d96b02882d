// The sampling kernel: greedy ties and NaNs across the CTAs a row's scan is split over, top-k,
// top-p. Without a CUDA device the test skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "tests/cuda_test_util.h"
#include "tests/gpu_test_util.h"
#include "worker/backends/cuda/kernels/sampling.h"

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

}  // namespace
}  // namespace tailserve
