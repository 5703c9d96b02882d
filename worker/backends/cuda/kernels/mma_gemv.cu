#include "worker/backends/cuda/kernels/mma_gemv.h"

#include <algorithm>
#include <cstdint>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kWarps = 8;

// W is read once: past L1, so X's vectors stay there.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Word q (0..7) of a lane's 16 consecutive halves.
__device__ __forceinline__ uint32_t Word(const uint4 (&v)[2], int q) {
  const uint4& u = v[q >> 2];
  switch (q & 3) {
    case 0: return u.x;
    case 1: return u.y;
    case 2: return u.z;
    default: return u.w;
  }
}

// A warp: T tiles of 16 columns; KS warps of a CTA split k by 64-wide blocks (interleaved). In
// block b, lane (g = lane / 4, c = lane % 4) loads halves [64 b + 16 c, + 16) of W rows g and g + 8
// of each tile and of X rows g and g + 8: at mma step j its A fragment is words 2j, 2j + 1 of the
// two W rows and its B fragments those of the two X rows, a permutation of the block's 64 k that
// A and B share. Each step's loads for block b + KS are issued before block b's mma.
template <int KS, int T>
__global__ void __launch_bounds__(kWarps * 32, T == 1 ? 3 : 2) MmaGemvKernel(MmaGemvArgs a) {
  __shared__ float part_s[KS > 1 ? kWarps : 1][T * 8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slice = warp % KS;
  const int g = lane >> 2, c = lane & 3;
  const int col0 = (blockIdx.x * (kWarps / KS) + warp / KS) * 16 * T;
  const int vecs = a.k / 8, blocks = (vecs + 7) / 8;
  // Columns past n and rows past `rows` read the last real one: their results are never written.
  const uint4* wrow[T][2];
#pragma unroll
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = min(col0 + 16 * t + g + 8 * h, a.n - 1);
      wrow[t][h] = reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(col) * a.k);
    }
  }
  const uint4* xrow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    xrow[h] = reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(min(g + 8 * h, a.rows - 1)) * a.k);
  }
  auto load_w = [&](int b, uint4 (&wv)[T][2][2]) {
    const int v = b * 8 + 2 * c;
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 2; ++i) wv[t][h][i] = v + i < vecs ? LoadStreaming(wrow[t][h] + v + i) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto load_x = [&](int b, uint4 (&xv)[2][2]) {
    const int v = b * 8 + 2 * c;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 2; ++i) xv[h][i] = v + i < vecs ? xrow[h][v + i] : make_uint4(0, 0, 0, 0);
    }
  };
  float acc[T][2][4] = {};
  uint4 wv[T][2][2], xv[2][2];
  if (slice < blocks) load_w(slice, wv);  // W is never written: loaded before the wait
  GridDependencyWait();
  TriggerDependents();
  if (slice < blocks) load_x(slice, xv);
  for (int b = slice; b < blocks; b += KS) {
    uint4 wn[T][2][2], xn[2][2];
    const bool more = b + KS < blocks;
    if (more) load_w(b + KS, wn), load_x(b + KS, xn);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const uint32_t af[4] = {Word(wv[t][0], 2 * j), Word(wv[t][1], 2 * j), Word(wv[t][0], 2 * j + 1),
                                Word(wv[t][1], 2 * j + 1)};
        Mma(acc[t][0], af, Word(xv[0], 2 * j), Word(xv[0], 2 * j + 1));
        Mma(acc[t][1], af, Word(xv[1], 2 * j), Word(xv[1], 2 * j + 1));
      }
    }
    if (more) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[t][h][0] = wn[t][h][0], wv[t][h][1] = wn[t][h][1];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) xv[h][0] = xn[h][0], xv[h][1] = xn[h][1];
    }
  }
  if constexpr (KS > 1) {
    if (slice > 0) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int i = 0; i < 8; ++i) part_s[warp][8 * t + i][lane] = acc[t][i / 4][i % 4];
      }
    }
    __syncthreads();
    if (slice > 0) return;
#pragma unroll
    for (int s = 1; s < KS; ++s) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[t][i / 4][i % 4] += part_s[warp + s][8 * t + i][lane];
      }
    }
  }
  // Lane (g, c) holds, for tile t and half nh, columns col0 + 16t + g (i = 0, 1) and + 8 (i = 2, 3)
  // of rows 8 nh + 2c (i even) and + 1 (i odd).
  float sq[2][2] = {};
#pragma unroll
  for (int nh = 0; nh < 2; ++nh) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * nh + 2 * c + e;
      if (r >= a.rows) continue;
      const float s = a.in_sumsq != nullptr ? rsqrtf(a.in_sumsq[r] / a.k + a.eps) : 1.0f;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const int col = col0 + 16 * t + g;
        if (a.swiglu_out != nullptr) {
          if (col < a.n) {
            a.swiglu_out[static_cast<int64_t>(r) * (a.n / 2) + (col0 + 16 * t) / 2 + g] =
                __float2half(Silu(acc[t][nh][e] * s) * (acc[t][nh][2 + e] * s));
          }
          continue;
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int cc = col + 8 * hh;
          if (cc >= a.n) continue;
          const int64_t at = static_cast<int64_t>(r) * a.n + cc;
          float v = acc[t][nh][2 * hh + e] * s;
          if (a.bias != nullptr) v += a.bias[cc];
          if (a.beta != 0.0f) v += a.beta * a.y[at];
          a.y[at] = v;
          if (a.y16 != nullptr) a.y16[at] = __float2half(fminf(fmaxf(v, -65504.0f), 65504.0f));
          sq[nh][e] += v * v;
        }
      }
    }
  }
  if (a.out_sumsq == nullptr) return;
#pragma unroll
  for (int nh = 0; nh < 2; ++nh) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = sq[nh][e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      const int r = 8 * nh + 2 * c + e;
      if (g == 0 && r < a.rows) atomicAdd(a.out_sumsq + r, v);
    }
  }
}

template <int KS, int T>
cudaError_t Launch(const MmaGemvArgs& a, cudaStream_t stream) {
  const int groups = (a.n + 16 * T - 1) / (16 * T), per_cta = kWarps / KS;
  return LaunchMaybeOverlapped(a.overlap_previous, (groups + per_cta - 1) / per_cta, dim3(kWarps * 32), 0, stream,
                               MmaGemvKernel<KS, T>, a);
}

}  // namespace

absl::Status MmaGemv(const MmaGemvArgs& a, cudaStream_t stream) {
  if (a.rows < 1 || a.rows > kMmaGemvMaxRows || a.k <= 0 || a.k % 8 != 0 || a.n <= 0 || a.x == nullptr ||
      a.w == nullptr || (a.y == nullptr) == (a.swiglu_out == nullptr) || (a.swiglu_out != nullptr && a.n % 16 != 0) ||
      (a.y16 != nullptr && a.y == nullptr)) {
    return absl::InvalidArgumentError(
        "MmaGemv: 1..16 rows, k a multiple of 8, one output (SwiGLU: n a multiple of 16), y16 beside y");
  }
  int ks = a.split, tiles = a.tiles;
  if (tiles == 0) tiles = 1;
  if (ks == 0) {
    // Provisional: the finest split that still leaves a warp four 64-wide blocks of k.
    const int blocks = (a.k / 8 + 7) / 8;
    ks = 1;
    while (ks < kWarps && blocks >= 4 * 2 * ks) ks *= 2;
  }
  cudaError_t launched;
  switch (ks * 10 + tiles) {
    case 11: launched = Launch<1, 1>(a, stream); break;
    case 12: launched = Launch<1, 2>(a, stream); break;
    case 21: launched = Launch<2, 1>(a, stream); break;
    case 22: launched = Launch<2, 2>(a, stream); break;
    case 41: launched = Launch<4, 1>(a, stream); break;
    case 42: launched = Launch<4, 2>(a, stream); break;
    case 81: launched = Launch<8, 1>(a, stream); break;
    case 82: launched = Launch<8, 2>(a, stream); break;
    default: return absl::InvalidArgumentError("MmaGemv: split 1, 2, 4 or 8 and 1 or 2 tiles a warp");
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(launched);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
