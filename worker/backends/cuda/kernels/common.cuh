#pragma once
// Device helpers shared by the kernels: warp and block reductions.
#include <cuda_fp16.h>

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

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + expf(-g)); }

// Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
// serialization may start once every CTA of the previous kernel has called TriggerDependents, and
// must GridDependencyWait before it reads what that kernel writes. Launched normally, both are
// no-ops.
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

}  // namespace tailserve::cuda
