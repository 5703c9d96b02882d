#include "worker/backends/cuda/kernels/mma_gemv.h"

#include <algorithm>
#include <cstdint>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kChunk = 256;                        // k a stage holds (halves): 512 bytes a row
constexpr int kRowBytes = kChunk * 2 + 64;         // padded: rows g and g + 1 fall 64 banks-bytes apart
constexpr int kStageBytes = 32 * kRowBytes;        // 16 W rows, then 16 X rows
constexpr int kStages = 3;
constexpr int kWarpBytes = kStages * kStageBytes;  // a warp's private ring

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void BarrierInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddress(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void BarrierExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddress(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @p bra DONE;\n"
      " bra WAIT;\n DONE:\n }" ::"r"(SmemAddress(bar)),
      "r"(parity)
      : "memory");
}
// One contiguous copy global -> shared, completing `bytes` of the barrier's transaction.
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   SmemAddress(dst)),
               "l"(src), "r"(bytes), "r"(SmemAddress(bar))
               : "memory");
}

// Word q (0..7) of a lane's two 16-byte vectors.
__device__ __forceinline__ uint32_t Word(const uint4 (&v)[2], int q) {
  const uint4& u = v[q >> 2];
  switch (q & 3) {
    case 0: return u.x;
    case 1: return u.y;
    case 2: return u.z;
    default: return u.w;
  }
}

// A CTA: KS warps on one tile of 16 columns, splitting k by 256-wide chunks (interleaved). Each warp
// streams its chunks through a private ring of kStages stages in shared memory: its 32 lanes each
// copy one row (16 of W, 16 of X) with one bulk copy, completing on the stage's mbarrier, so the
// bytes in flight cost no registers and no barrier joins the warps until the epilogue. Within a
// chunk, in 64-wide block j, lane (g = lane / 4, c = lane % 4) reads 16-byte vectors c and c + 4 of
// W rows g and g + 8 and of X rows g and g + 8: at mma step s its A fragment is words 2s, 2s + 1 of
// the two W rows and its B fragments those of the two X rows, a permutation of the block's 64 k
// that A and B share.
template <int KS>
__global__ void __launch_bounds__(KS * 32) MmaGemvKernel(MmaGemvArgs a) {
  extern __shared__ __align__(128) unsigned char ring_s[];  // [warp][stage][32 rows][kRowBytes]
  __shared__ __align__(8) uint64_t full_s[KS][kStages];
  __shared__ float part_s[KS > 1 ? KS : 1][8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int col0 = blockIdx.x * 16;
  const int vecs = a.k / 8, chunks = (a.k + kChunk - 1) / kChunk;
  unsigned char* ring = ring_s + warp * kWarpBytes;
  uint64_t* full = full_s[warp];
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) BarrierInit(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  // This lane's row: W rows 0..15 of the tile (past n: the last real one, never written back),
  // then X rows 0..15 (past `rows`: the last real one).
  const __half* src = lane < 16 ? a.w + static_cast<int64_t>(min(col0 + lane, a.n - 1)) * a.k
                                : a.x + static_cast<int64_t>(min(lane - 16, a.rows - 1)) * a.k;
  auto bytes_of = [&](int ch) { return static_cast<uint32_t>(min(kChunk, a.k - ch * kChunk) * 2); };
  // Stage s takes chunk ch: lane 0 announces the bytes, then every lane copies its row. W may go
  // before the previous kernel finishes; X only after (copy_x).
  auto expect = [&](int ch, int s) {
    if (lane == 0) BarrierExpect(&full[s], 32 * bytes_of(ch));
    __syncwarp();
  };
  auto copy = [&](int ch, int s, bool w_rows) {
    if ((lane < 16) == w_rows) BulkCopy(ring + s * kStageBytes + lane * kRowBytes, src + ch * kChunk, bytes_of(ch), &full[s]);
  };
  int first[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    first[s] = warp + s * KS;
    if (first[s] < chunks) expect(first[s], s), copy(first[s], s, true);
  }
  GridDependencyWait();
  TriggerDependents();
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (first[s] < chunks) copy(first[s], s, false);
  }
  float acc[2][4] = {};
  int stage = 0;
  uint32_t parity = 0;
  for (int ch = warp; ch < chunks; ch += KS) {
    BarrierWait(&full[stage], parity);
    const unsigned char* base = ring + stage * kStageBytes;
    const int blocks = (min(kChunk, a.k - ch * kChunk) + 63) / 64;
    for (int j = 0; j < blocks; ++j) {
      const int v = ch * (kChunk / 8) + j * 8 + c;  // this lane's first vector, in 16-byte units of the row
      uint4 wv[2][2], xv[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const bool in = v + 4 * i < vecs;
          const int at = j * 128 + (c + 4 * i) * 16;
          wv[h][i] = in ? *reinterpret_cast<const uint4*>(base + (g + 8 * h) * kRowBytes + at) : make_uint4(0, 0, 0, 0);
          xv[h][i] = in ? *reinterpret_cast<const uint4*>(base + (16 + g + 8 * h) * kRowBytes + at) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t af[4] = {Word(wv[0], 2 * s), Word(wv[1], 2 * s), Word(wv[0], 2 * s + 1), Word(wv[1], 2 * s + 1)};
        Mma(acc[0], af, Word(xv[0], 2 * s), Word(xv[0], 2 * s + 1));
        Mma(acc[1], af, Word(xv[1], 2 * s), Word(xv[1], 2 * s + 1));
      }
    }
    // Refill this stage with the chunk kStages ahead, after every lane has read it (the copy is the
    // async proxy's write after the generic proxy's reads).
    const int next = ch + kStages * KS;
    __syncwarp();
    if (next < chunks) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      expect(next, stage), copy(next, stage, true), copy(next, stage, false);
    }
    if (++stage == kStages) stage = 0, parity ^= 1;
  }
  if constexpr (KS > 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) part_s[warp][i][lane] = acc[i / 4][i % 4];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float t = 0.0f;
#pragma unroll
      for (int w = 0; w < KS; ++w) t += part_s[w][i][lane];
      acc[i / 4][i % 4] = t;
    }
  }
  // Lane (g, c) holds, for half nh, columns col0 + g (i = 0, 1) and + 8 (i = 2, 3) of rows
  // 8 nh + 2c (i even) and + 1 (i odd).
  float sq[2][2] = {};
#pragma unroll
  for (int nh = 0; nh < 2; ++nh) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * nh + 2 * c + e;
      if (r >= a.rows) continue;
      const float s = a.in_sumsq != nullptr ? rsqrtf(a.in_sumsq[r] / a.k + a.eps) : 1.0f;
      const int col = col0 + g;
      if (a.swiglu_out != nullptr) {
        if (col < a.n) {
          a.swiglu_out[static_cast<int64_t>(r) * (a.n / 2) + col0 / 2 + g] =
              __float2half(Silu(acc[nh][e] * s) * (acc[nh][2 + e] * s));
        }
        continue;
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int cc = col + 8 * hh;
        if (cc >= a.n) continue;
        const int64_t at = static_cast<int64_t>(r) * a.n + cc;
        float v = acc[nh][2 * hh + e] * s;
        if (a.bias != nullptr) v += a.bias[cc];
        if (a.beta != 0.0f) v += a.beta * a.y[at];
        a.y[at] = v;
        if (a.y16 != nullptr) a.y16[at] = __float2half(fminf(fmaxf(v, -65504.0f), 65504.0f));
        sq[nh][e] += v * v;
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

template <int KS>
cudaError_t Launch(const MmaGemvArgs& a, cudaStream_t stream) {
  constexpr int smem = KS * kWarpBytes;
  const cudaError_t opted = cudaFuncSetAttribute(MmaGemvKernel<KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (opted != cudaSuccess) return opted;
  return LaunchMaybeOverlapped(a.overlap_previous, dim3((a.n + 15) / 16), dim3(KS * 32), smem, stream,
                               MmaGemvKernel<KS>, a);
}

}  // namespace

absl::Status MmaGemv(const MmaGemvArgs& a, cudaStream_t stream) {
  if (a.rows < 1 || a.rows > kMmaGemvMaxRows || a.k <= 0 || a.k % 8 != 0 || a.n <= 0 || a.x == nullptr ||
      a.w == nullptr || (a.y == nullptr) == (a.swiglu_out == nullptr) || (a.swiglu_out != nullptr && a.n % 16 != 0) ||
      (a.y16 != nullptr && a.y == nullptr)) {
    return absl::InvalidArgumentError(
        "MmaGemv: 1..16 rows, k a multiple of 8, one output (SwiGLU: n a multiple of 16), y16 beside y");
  }
  int ks = a.split;
  if (ks == 0) {  // provisional: enough warps to keep the GPU's DRAM busy
    const int tiles = (a.n + 15) / 16, chunks = (a.k + kChunk - 1) / kChunk;
    ks = 1;
    while (ks < 4 && tiles * ks < 512 && chunks >= 2 * kStages * 2 * ks) ks *= 2;
  }
  cudaError_t launched;
  switch (ks) {
    case 1: launched = Launch<1>(a, stream); break;
    case 2: launched = Launch<2>(a, stream); break;
    case 4: launched = Launch<4>(a, stream); break;
    default: return absl::InvalidArgumentError("MmaGemv: split 1, 2 or 4");
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(launched);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
