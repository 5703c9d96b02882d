#include "bench/ring_probe.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/tma.cuh"

namespace tailserve::bench {
namespace {

using cuda::tma::BarrierArrive;
using cuda::tma::BarrierExpect;
using cuda::tma::BarrierInit;
using cuda::tma::BarrierWait;
using cuda::tma::LdMatrix4;
using cuda::tma::Mma;
using cuda::tma::Smem;
using cuda::tma::Swizzled;
using cuda::tma::TmaLoad;

constexpr int kBoxK = cuda::tma::kBoxK;
constexpr int kWBoxBytes = 64 * kBoxK * 2;  // 8 KB
constexpr int kXBoxBytes = 16 * kBoxK * 2;  // 2 KB
constexpr int kConsumers = 4;
constexpr int kSmemLimit = 227 * 1024;

template <int KB, int L>
struct Layout {
  static constexpr bool kWithX = L >= 1;
  static constexpr int kStageBytes = KB * (kWBoxBytes + (kWithX ? kXBoxBytes : 0));
  // The bare ring: 160 KB (StreamFfn's W in flight at 4 boxes); from kX on, StreamFfn's count.
  static constexpr int kStages = kWithX ? (kSmemLimit - 1024) / kStageBytes : 160 * 1024 / kStageBytes;
  static constexpr int kSmem = kStages * kStageBytes + 1024;
};
constexpr int kMaxStages = (kSmemLimit - 1024) / (kWBoxBytes + kXBoxBytes);

// Warps 0-3 consume, warp 4's lane 0 produces (its other lanes exit). Below kClaim each CTA
// streams tiles blockIdx, + gridDim, ...; from kClaim on the producer claims tiles from
// counters[0], as StreamFfn does its items.
template <int KB, int L>
__global__ void __launch_bounds__((kConsumers + 1) * 32, 1)
    RingProbeKernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map, int tiles,
                    int k_stages, int stages_arg, float* out, int* counters) {
  using C = Layout<KB, L>;
  constexpr int kStageBytes = C::kStageBytes;
  // StreamFfn reads its stage count from its parameters; the levels below kClaim know it.
  const int stages = L >= 2 ? stages_arg : C::kStages;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_s[kMaxStages], empty_s[kMaxStages];
  __shared__ int tile_s[kMaxStages];
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) BarrierInit(&full_s[s], 1), BarrierInit(&empty_s[s], kConsumers);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int my_tiles = (tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / gridDim.x;
  if (warp == kConsumers) {
    if (lane != 0) return;
    uint64_t stream_policy, keep_policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(stream_policy));
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep_policy));
    for (int slot = 0, n = 0;; ++n) {
      const int tile = L >= 2 ? atomicAdd(counters, 1) : (n < my_tiles ? static_cast<int>(blockIdx.x) + n * gridDim.x : tiles);
      const bool more = tile < tiles;
      for (int kb = 0; kb < (more ? k_stages : 1); ++kb, ++slot) {
        const int s = slot % stages;
        if (slot >= stages) BarrierWait(&empty_s[s], ((slot / stages) - 1) & 1);
        tile_s[s] = more ? tile : -1;  // published by the arrive's release
        if (!more) {
          BarrierArrive(&full_s[s]);
          break;
        }
        BarrierExpect(&full_s[s], kStageBytes);
#pragma unroll
        for (int b = 0; b < KB; ++b) {
          TmaLoad(ring + s * kStageBytes + b * kWBoxBytes, &w_map, (kb * KB + b) * kBoxK, tile * 64, &full_s[s],
                  stream_policy);
          if constexpr (C::kWithX) {
            TmaLoad(ring + s * kStageBytes + KB * kWBoxBytes + b * kXBoxBytes, &x_map, (kb * KB + b) * kBoxK, 0,
                    &full_s[s], keep_policy);
          }
        }
      }
      if (!more) break;
    }
  } else {
    const int w_row = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), w_half = lane >> 4;
    const int x_row = (lane & 7) + 8 * (lane >> 4), x_half = (lane >> 3) & 1;
    const uint32_t ring_addr = Smem(ring);
    float acc[2][4] = {};
    for (int slot = 0, kb = 0;; ++slot) {
      const int s = slot % stages;
      BarrierWait(&full_s[s], (slot / stages) & 1);
      const int tile = tile_s[s];
      if (tile < 0) break;
      if constexpr (L >= 4) {
        const uint32_t stage = ring_addr + s * kStageBytes;
#pragma unroll
        for (int b = 0; b < KB; ++b) {
          const uint32_t w_base = stage + b * kWBoxBytes, x_base = stage + KB * kWBoxBytes + b * kXBoxBytes;
#pragma unroll
          for (int ks = 0; ks < kBoxK / 16; ++ks) {
            uint32_t bx[4], a[4];
            LdMatrix4(x_base + Swizzled(x_row, 2 * ks + x_half), bx);
            LdMatrix4(w_base + Swizzled(w_row, 2 * ks + w_half), a);
            Mma(acc[0], a, bx[0], bx[1]);
            Mma(acc[1], a, bx[2], bx[3]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) BarrierArrive(&empty_s[s]);
      if (++kb < k_stages) continue;
      kb = 0;
      if constexpr (L >= 3) {
        // StreamFfn's gate/up epilogue: the warp's 16 columns of 16 rows out, then counted.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = tile * 64 + 16 * warp + (lane >> 2) + 8 * (i >> 1), row = 8 * j + 2 * (lane & 3) + (i & 1);
            out[static_cast<int64_t>(row) * tiles * 64 + col] = acc[j][i];
            acc[j][i] = 0.0f;
          }
        }
        asm volatile("fence.proxy.async.global;" ::: "memory");
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
        if (threadIdx.x == 0) {
          __threadfence();
          atomicAdd(counters + 2, 1);
        }
      }
    }
  }
  __syncthreads();
  if (L >= 2 && threadIdx.x == 0) {  // the last CTA out zeroes the counters for the next launch
    __threadfence();
    if (atomicAdd(counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
      __threadfence();
      counters[0] = 0, counters[1] = 0, counters[2] = 0;
      __threadfence();
    }
  }
}

template <int KB, int L>
absl::Status Launch(const RingProbeArgs& a, const CUtensorMap& w_map, const CUtensorMap& x_map, cudaStream_t stream) {
  using C = Layout<KB, L>;
  static bool attributes = false;  // the bench's one device
  if (!attributes) {
    TAILSERVE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(RingProbeKernel<KB, L>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    attributes = true;
  }
  RingProbeKernel<KB, L><<<a.ctas, (kConsumers + 1) * 32, C::kSmem, stream>>>(
      w_map, x_map, a.rows / 64, a.k / (kBoxK * KB), C::kStages, a.out, a.counters);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <int KB>
absl::Status AtLevel(const RingProbeArgs& a, const CUtensorMap& w_map, const CUtensorMap& x_map, cudaStream_t stream) {
  switch (a.level) {
    case RingLevel::kBare: return Launch<KB, 0>(a, w_map, x_map, stream);
    case RingLevel::kX: return Launch<KB, 1>(a, w_map, x_map, stream);
    case RingLevel::kClaim: return Launch<KB, 2>(a, w_map, x_map, stream);
    case RingLevel::kEpilogue: return Launch<KB, 3>(a, w_map, x_map, stream);
    default: return Launch<KB, 4>(a, w_map, x_map, stream);
  }
}

}  // namespace

absl::Status RingProbe(const RingProbeArgs& a, cudaStream_t stream) {
  const int tiles = a.rows / 64, level = static_cast<int>(a.level);
  if (a.w == nullptr || a.x == nullptr || a.out == nullptr || a.counters == nullptr || a.rows <= 0 ||
      a.rows % 64 != 0 || (a.k_boxes != 1 && a.k_boxes != 2 && a.k_boxes != 4) || a.k <= 0 ||
      a.k % (kBoxK * a.k_boxes) != 0 || level < 0 || level >= kRingLevels || a.ctas < 1 || a.ctas > tiles) {
    return absl::InvalidArgumentError(
        "RingProbe: rows a multiple of 64, 1, 2 or 4 k boxes dividing k, a level, 1 .. rows / 64 CTAs, x, out and "
        "counters");
  }
  CUtensorMap w_map, x_map;
  TAILSERVE_RETURN_IF_ERROR(cuda::tma::Map(&w_map, a.w, a.k, a.rows, 64));
  TAILSERVE_RETURN_IF_ERROR(cuda::tma::Map(&x_map, a.x, a.k, 16, 16));
  if (a.k_boxes == 4) return AtLevel<4>(a, w_map, x_map, stream);
  return a.k_boxes == 2 ? AtLevel<2>(a, w_map, x_map, stream) : AtLevel<1>(a, w_map, x_map, stream);
}

}  // namespace tailserve::bench
