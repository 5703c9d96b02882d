#include "bench/ring_probe.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/tma.cuh"

namespace tailserve::bench {
namespace {

using cuda::tma::BarrierArrive;
using cuda::tma::BarrierExpect;
using cuda::tma::BarrierInit;
using cuda::tma::BarrierWait;
using cuda::tma::TmaLoad;

constexpr int kBoxBytes = 64 * cuda::tma::kBoxK * 2;  // 8 KB
constexpr int kRingBytes = 160 * 1024;                // StreamFfn's W bytes in flight at 4 boxes
constexpr int kMaxStages = kRingBytes / kBoxBytes;

// Warps 0 .. C - 1 consume, warp C's lane 0 produces. Each CTA streams its tiles' k boxes in order.
template <int KB, int C, bool kDivide>
__global__ void __launch_bounds__((C + 1) * 32, 1)
    RingProbeKernel(const __grid_constant__ CUtensorMap map, int tiles, int k_stages) {
  constexpr int kStageBytes = KB * kBoxBytes, kStages = kRingBytes / kStageBytes;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_s[kMaxStages], empty_s[kMaxStages];
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) BarrierInit(&full_s[s], 1), BarrierInit(&empty_s[s], C > 0 ? C : 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int my_tiles = (tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / gridDim.x;
  const int total = my_tiles * k_stages;  // stages this CTA streams
  if (warp == C) {
    if (lane != 0) return;
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    int s = 0, round = 0;  // counted: slot % stages, slot / stages
    for (int slot = 0, tile = blockIdx.x, kb = 0; slot < total; ++slot) {
      if constexpr (kDivide) s = slot % kStages, round = slot / kStages;
      if (slot >= kStages) {
        // With consumers, wait for the stage's release; without, for its last bytes to land.
        BarrierWait(C > 0 ? &empty_s[s] : &full_s[s], (round - 1) & 1);
      }
      BarrierExpect(&full_s[s], kStageBytes);
#pragma unroll
      for (int b = 0; b < KB; ++b) {
        TmaLoad(ring + s * kStageBytes + b * kBoxBytes, &map, (kb * KB + b) * cuda::tma::kBoxK, tile * 64,
                &full_s[s], policy);
      }
      if (++kb == k_stages) kb = 0, tile += gridDim.x;
      if constexpr (!kDivide) {
        if (++s == kStages) s = 0, ++round;
      }
    }
    if constexpr (C == 0) {  // the last stages' bytes before the CTA exits
      for (int slot = total < kStages ? 0 : total - kStages; slot < total; ++slot) {
        BarrierWait(&full_s[slot % kStages], (slot / kStages) & 1);
      }
    }
    return;
  }
  for (int slot = 0; slot < total; ++slot) {
    const int s = slot % kStages;
    BarrierWait(&full_s[s], (slot / kStages) & 1);
    __syncwarp();
    if (lane == 0) BarrierArrive(&empty_s[s]);
  }
}

template <int KB, int C, bool kDivide>
absl::Status Launch(const CUtensorMap& map, int tiles, int k_stages, int ctas, cudaStream_t stream) {
  constexpr int kSmem = kRingBytes + 1024;
  static bool attributes = false;  // the bench's one device
  if (!attributes) {
    TAILSERVE_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(RingProbeKernel<KB, C, kDivide>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    attributes = true;
  }
  RingProbeKernel<KB, C, kDivide><<<ctas, (C + 1) * 32, kSmem, stream>>>(map, tiles, k_stages);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <int KB>
absl::Status WithConsumers(const RingProbeArgs& a, const CUtensorMap& map, int tiles, cudaStream_t stream) {
  const int k_stages = a.k / (cuda::tma::kBoxK * KB);
  switch (a.consumers * 2 + (a.divide ? 1 : 0)) {
    case 0: return Launch<KB, 0, false>(map, tiles, k_stages, a.ctas, stream);
    case 1: return Launch<KB, 0, true>(map, tiles, k_stages, a.ctas, stream);
    case 2: return Launch<KB, 1, false>(map, tiles, k_stages, a.ctas, stream);
    case 3: return Launch<KB, 1, true>(map, tiles, k_stages, a.ctas, stream);
    case 8: return Launch<KB, 4, false>(map, tiles, k_stages, a.ctas, stream);
    default: return Launch<KB, 4, true>(map, tiles, k_stages, a.ctas, stream);
  }
}

}  // namespace

absl::Status RingProbe(const RingProbeArgs& a, cudaStream_t stream) {
  const int tiles = a.rows / 64;
  if (a.w == nullptr || a.rows <= 0 || a.rows % 64 != 0 || (a.k_boxes != 1 && a.k_boxes != 2 && a.k_boxes != 4) ||
      a.k <= 0 || a.k % (cuda::tma::kBoxK * a.k_boxes) != 0 || (a.consumers != 0 && a.consumers != 1 && a.consumers != 4) ||
      a.ctas < 1 || a.ctas > tiles) {
    return absl::InvalidArgumentError(
        "RingProbe: rows a multiple of 64, 1, 2 or 4 k boxes dividing k, 0, 1 or 4 consumers, 1 .. rows / 64 CTAs");
  }
  CUtensorMap map;
  if (absl::Status s = cuda::tma::Map(&map, a.w, a.k, a.rows, 64); !s.ok()) return s;
  if (a.k_boxes == 4) return WithConsumers<4>(a, map, tiles, stream);
  return a.k_boxes == 2 ? WithConsumers<2>(a, map, tiles, stream) : WithConsumers<1>(a, map, tiles, stream);
}

}  // namespace tailserve::bench
