#include "worker/backends/cuda/kernels/gemv.h"

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kWarps = 8;

// Warp w of block b computes column b * kWarps + w for R rows (rows beyond `rows` are skipped).
template <int R>
__global__ void __launch_bounds__(kWarps * 32) GemvKernel(const __half* x, int rows, int k, const __half* w, int n,
                                                           float beta, float* y) {
  const int lane = threadIdx.x & 31, col = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (col >= n) return;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(col) * k);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int vecs = k / 8;
#pragma unroll 4
  for (int v = lane; v < vecs; v += 32) {
    const uint4 wv = wrow[v];
    const __half2* wh = reinterpret_cast<const __half2*>(&wv);
    float2 wf[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) wf[i] = __half22float2(wh[i]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
      const uint4 xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(r) * k)[v];
      const __half2* xh = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 xf = __half22float2(xh[i]);
        acc[r] += wf[i].x * xf.x + wf[i].y * xf.y;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    const float sum = WarpSum(acc[r]);
    if (lane == 0) {
      float* out = y + static_cast<int64_t>(r) * n + col;
      *out = beta == 0.0f ? sum : sum + beta * *out;
    }
  }
}

}  // namespace

absl::Status Gemv(const __half* x, int rows, int k, const __half* w, int n, float beta, float* y, cudaStream_t stream) {
  if (rows < 1 || rows > kGemvMaxRows || k % 8 != 0) {
    return absl::InvalidArgumentError("Gemv: 1..8 rows and k a multiple of 8");
  }
  const dim3 grid((n + kWarps - 1) / kWarps), block(kWarps * 32);
  if (rows == 1) {
    GemvKernel<1><<<grid, block, 0, stream>>>(x, rows, k, w, n, beta, y);
  } else if (rows == 2) {
    GemvKernel<2><<<grid, block, 0, stream>>>(x, rows, k, w, n, beta, y);
  } else if (rows <= 4) {
    GemvKernel<4><<<grid, block, 0, stream>>>(x, rows, k, w, n, beta, y);
  } else {
    GemvKernel<8><<<grid, block, 0, stream>>>(x, rows, k, w, n, beta, y);
  }
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
