#include "worker/backends/cuda/kernels/copy.h"

#include <algorithm>
#include <cstdint>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

// 16-byte pieces across the grid (a step's inputs fit in one pass: one PCIe round trip per
// thread), then the tail byte by byte. A follower launched programmatically may start at once
// (the decode graph's embedding, which reads none of this).
__global__ void CopyKernel(const uint4* src, uint4* dst, size_t vectors, size_t bytes) {
  TriggerDependents();
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) dst[i] = src[i];
  const size_t tail = bytes - 16 * vectors;
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    reinterpret_cast<char*>(dst + vectors)[threadIdx.x] = reinterpret_cast<const char*>(src + vectors)[threadIdx.x];
  }
}

}  // namespace

absl::Status CopyBytes(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 != 0) {
    return absl::InvalidArgumentError("CopyBytes: src and dst 16-byte aligned");
  }
  constexpr int kThreads = 256;
  const size_t vectors = bytes / 16;
  const int blocks = static_cast<int>(std::clamp<size_t>((vectors + kThreads - 1) / kThreads, 1, 64));
  CopyKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), vectors, bytes);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
