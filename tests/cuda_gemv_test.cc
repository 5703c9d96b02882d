// The decode Gemv against the CPU: every epilogue on odd sizes, launched programmatically after
// another Gemv, and with RoPE fused (batch 1's q/k/v). Without a CUDA device every test skips.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/cuda_test_util.h"
#include "tests/gpu_test_util.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/kernels/gemv.h"

namespace tailserve {
namespace {

using namespace testing;

// Every epilogue of the decode Gemv: plain, residual add + bias + output sum of squares, fused
// RMSNorm of an fp32 input, and SwiGLU over interleaved gate/up rows. n odd (a half-filled last
// column pair) except for SwiGLU.
// Gemv against the CPU: the cases of tests/kernel_cases/gemv_cases.cc (which the kernel bench
// also times), then a k split it does not take.
TEST(CudaKernelTest, GemvMatchesCpuOnOddSizes) {
  REQUIRE_GPU();
  for (const kernel_cases::CaseSpec& spec : kernel_cases::GemvCases(77)) ExpectCaseMatches(spec);
  Dev<__half> dx(std::vector<__half>(8)), dw(std::vector<__half>(8));
  Dev<float> dy(std::vector<float>(1));
  EXPECT_EQ(cuda::Gemv({.x = dx.p, .k = 8, .w = dw.p, .n = 1, .y = dy.p, .k_split = 3}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
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

}  // namespace
}  // namespace tailserve
