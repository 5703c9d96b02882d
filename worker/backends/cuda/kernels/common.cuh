#pragma once
// Device helpers shared by the kernels: warp and block reductions.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tailserve::cuda {

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction with a warp reduction WarpOp (blockDim.x a multiple of 32, at most
// 1024); every thread gets the result. `identity` fills the slots of absent warps.
template <float (*WarpOp)(float)>
__device__ __forceinline__ float BlockReduce(float v, float* shared32, float identity) {
  v = WarpOp(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  v = lane < warps ? shared32[lane] : identity;
  return WarpOp(v);
}
__device__ __forceinline__ float BlockSum(float v, float* shared32) { return BlockReduce<WarpSum>(v, shared32, 0.0f); }
__device__ __forceinline__ float BlockMax(float v, float* shared32) {
  return BlockReduce<WarpMax>(v, shared32, -INFINITY);
}

// Kernel timelines (the kernel bench's per-item and per-CTA stamps) are compiled in only where
// TAILSERVE_KERNEL_TIMELINE is defined: the kernel bench's own copy of the kernels. The engine's
// kernels carry no stamp code, and their launchers refuse a timeline.
#ifdef TAILSERVE_KERNEL_TIMELINE
inline constexpr bool kTimelineBuild = true;
#else
inline constexpr bool kTimelineBuild = false;
#endif
// Whether a launch records its timeline: a constant false outside a timeline build.
template <typename T>
__host__ __device__ __forceinline__ bool Timed(const T* timeline) {
  return kTimelineBuild && timeline != nullptr;
}

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + expf(-g)); }

// Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
// serialization may start once every CTA of the previous kernel has called TriggerDependents, and
// must GridDependencyWait before it reads what that kernel writes. Launched normally, both are
// no-ops. A kernel that waits triggers only after its wait: a follower that starts early then
// overlaps this kernel alone, never the one before it, so what a follower does before its own
// wait (the attention's first tile and empty-split writes) can only race with its predecessor.
// The split combine, a cluster-merged attention's empty splits and the RMSNorm before StreamGemm or
// StreamFfn are the exceptions (attention.cu, attention_mma.cuh and rows.h say why).
__device__ __forceinline__ void TriggerDependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void GridDependencyWait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#ifdef TAILSERVE_NO_PROGRAMMATIC_LAUNCH  // see CMakeLists.txt: the kernels' wait may be compiled out
inline constexpr bool kProgrammaticLaunch = false;
#else
inline constexpr bool kProgrammaticLaunch = true;
#endif

// LaunchMaybeOverlapped (below), in clusters of cluster_z CTAs along z when cluster_z > 1.
template <typename... Params, typename... Args>
cudaError_t LaunchMaybeOverlappedInClusters(bool overlap, unsigned cluster_z, dim3 grid, dim3 block, size_t smem,
                                            cudaStream_t stream, void (*kernel)(Params...), Args... args) {
  cudaLaunchAttribute attrs[2] = {};
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem, config.stream = stream;
  config.attrs = attrs;
  if (kProgrammaticLaunch && overlap) {
    attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_z > 1) {
    attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[config.numAttrs++].val.clusterDim = {1, 1, cluster_z};
  }
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
// `overlap` (the stream must not be the legacy default one), and with `cluster_z` > 1 in
// thread-block clusters of (1, 1, cluster_z) CTAs (grid.z a multiple of it; above 8 the kernel
// must allow non-portable cluster sizes).
template <typename... Params, typename... Args>
cudaError_t LaunchMaybeOverlapped(bool overlap, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  void (*kernel)(Params...), Args... args) {
  return LaunchMaybeOverlappedInClusters(overlap, 1, grid, block, smem, stream, kernel, args...);
}

}  // namespace tailserve::cuda
