#pragma once
// Device helpers shared by the kernels: warp and block reductions, and programmatic dependent
// launch (PDL).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

namespace tailserve::cuda {

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float BlockSum(float v, float* shared32) {
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  v = lane < warps ? shared32[lane] : 0.0f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* shared32) {
  v = WarpMax(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  v = lane < warps ? shared32[lane] : -INFINITY;
  return WarpMax(v);
}

// Programmatic dependent launch: a decode step is ~230 short kernels in a row, and between two of
// them the GPU drains one grid before it starts the next. Kernels launched with LaunchPdl let the
// next grid become resident while this one finishes; each of them must call PdlWait() before it
// touches global memory, which returns once the previous grid has completed and its writes are
// visible (a no-op when launched without the attribute). Releasing dependents first is safe:
// they too wait for this grid to complete.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace tailserve::cuda
