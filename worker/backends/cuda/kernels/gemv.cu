#include "worker/backends/cuda/kernels/gemv.h"

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kWarps = 8;

// Eight consecutive inputs of row r at vector v, as floats.
__device__ __forceinline__ void LoadX(const GemvArgs& a, int r, int v, float (&xf)[8]) {
  if (a.x_f32 != nullptr) {
    const float4* p = reinterpret_cast<const float4*>(a.x_f32 + static_cast<int64_t>(r) * a.k) + 2 * v;
    const float4 lo = p[0], hi = p[1];
    xf[0] = lo.x, xf[1] = lo.y, xf[2] = lo.z, xf[3] = lo.w, xf[4] = hi.x, xf[5] = hi.y, xf[6] = hi.z, xf[7] = hi.w;
  } else {
    const uint4 raw = reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(r) * a.k)[v];
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      xf[2 * i] = f.x, xf[2 * i + 1] = f.y;
    }
  }
}

__device__ __forceinline__ float Dot8(const uint4& w, const float (&xf)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&w);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    s += f.x * xf[2 * i] + f.y * xf[2 * i + 1];
  }
  return s;
}

// A block's 8 warps take 8 / KS column pairs; the KS warps of a pair split its k range
// (interleaved 16-byte vectors) and meet in shared memory. Both columns of a pair share each load
// of x, and a lane keeps two W loads in flight per step. KS > 1 where there are few columns (the
// 8B shape's o and down projections: 2048 pairs), so that enough warps stream W at once.
template <int R, int KS>
__global__ void __launch_bounds__(kWarps * 32) GemvKernel(GemvArgs a) {
  __shared__ float part_s[kWarps][R][2];
  __shared__ float sumsq_s[kWarps][R];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slice = warp % KS;
  const int c0 = 2 * (blockIdx.x * (kWarps / KS) + warp / KS);
  const bool has0 = c0 < a.n, has1 = c0 + 1 < a.n;
  float acc0[R], acc1[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = 0.0f;
  if (has0) {
    const uint4* w0 = reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(c0) * a.k);
    const uint4* w1 = reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(has1 ? c0 + 1 : c0) * a.k);
    const int vecs = a.k / 8;
#pragma unroll 2
    for (int v = slice * 32 + lane; v < vecs; v += 32 * KS) {
      const uint4 wv0 = w0[v], wv1 = w1[v];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= a.rows) break;
        float xf[8];
        LoadX(a, r, v, xf);
        acc0[r] += Dot8(wv0, xf);
        acc1[r] += Dot8(wv1, xf);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc0[r] = WarpSum(acc0[r]), acc1[r] = WarpSum(acc1[r]);
  if (KS > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) part_s[warp][r][0] = acc0[r], part_s[warp][r][1] = acc1[r];
    }
    __syncthreads();
    if (lane == 0 && slice == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int k = 1; k < KS; ++k) acc0[r] += part_s[warp + k][r][0], acc1[r] += part_s[warp + k][r][1];
      }
    }
  }
  float sq[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    sq[r] = 0.0f;
    if (r >= a.rows || lane != 0 || slice != 0 || !has0) continue;
    float s0 = acc0[r], s1 = acc1[r];
    if (a.in_sumsq != nullptr) {
      const float inv = rsqrtf(a.in_sumsq[r] / a.k + a.eps);
      s0 *= inv, s1 *= inv;
    }
    if (a.swiglu_out != nullptr) {
      a.swiglu_out[static_cast<int64_t>(r) * (a.n / 2) + c0 / 2] = __float2half(s0 / (1.0f + expf(-s0)) * s1);
      continue;
    }
    float* out = a.y + static_cast<int64_t>(r) * a.n + c0;
    if (a.bias != nullptr) s0 += a.bias[c0], s1 += has1 ? a.bias[c0 + 1] : 0.0f;
    if (a.beta != 0.0f) s0 += a.beta * out[0], s1 += has1 ? a.beta * out[1] : 0.0f;
    out[0] = s0;
    if (has1) out[1] = s1;
    sq[r] = s0 * s0 + (has1 ? s1 * s1 : 0.0f);
  }
  if (a.out_sumsq == nullptr) return;
  // One atomic per row per block: lane 0 of each warp holds its columns' squares (0 off slice 0).
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) sumsq_s[warp][r] = sq[r];
  }
  __syncthreads();
  if (threadIdx.x < a.rows) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += sumsq_s[w][threadIdx.x];
    atomicAdd(a.out_sumsq + threadIdx.x, t);
  }
}

template <int R>
void LaunchRows(const GemvArgs& a, int ks, cudaStream_t stream) {
  const int pairs = (a.n + 1) / 2;
  const dim3 block(kWarps * 32);
  auto grid = [&](int k) { return dim3((pairs + kWarps / k - 1) / (kWarps / k)); };
  switch (ks) {
    case 1: GemvKernel<R, 1><<<grid(1), block, 0, stream>>>(a); break;
    case 2: GemvKernel<R, 2><<<grid(2), block, 0, stream>>>(a); break;
    case 4: GemvKernel<R, 4><<<grid(4), block, 0, stream>>>(a); break;
    default: GemvKernel<R, 8><<<grid(8), block, 0, stream>>>(a); break;
  }
}

}  // namespace

absl::Status Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.rows < 1 || a.rows > kGemvMaxRows || a.k % 8 != 0 || (a.x == nullptr) == (a.x_f32 == nullptr) ||
      (a.y == nullptr) == (a.swiglu_out == nullptr) || (a.swiglu_out != nullptr && a.n % 2 != 0)) {
    return absl::InvalidArgumentError("Gemv: 1..8 rows, k a multiple of 8, one input, one output (SwiGLU: n even)");
  }
  // Split k until about 8192 warps stream W (64 per SM), keeping 2+ vectors per lane and slice.
  const int pairs = (a.n + 1) / 2, vecs = a.k / 8;
  int ks = 1;
  while (ks < kWarps && pairs * ks < 8192 && vecs >= 64 * ks) ks *= 2;
  if (a.rows == 1) {
    LaunchRows<1>(a, ks, stream);
  } else if (a.rows == 2) {
    LaunchRows<2>(a, ks, stream);
  } else if (a.rows <= 4) {
    LaunchRows<4>(a, ks, stream);
  } else {
    LaunchRows<8>(a, ks, stream);
  }
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
