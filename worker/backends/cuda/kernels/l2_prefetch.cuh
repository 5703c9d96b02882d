#pragma once
#include "worker/backends/cuda/kernels/l2_prefetch.h"

namespace tailserve::cuda {

// Every thread of the grid issues its share of the ranges (fire and forget: nothing waits on them).
__device__ __forceinline__ void IssueL2Prefetch(const L2Prefetch& p) {
#if __CUDA_ARCH__ >= 900
  if (p.base == nullptr || p.bytes <= 0) return;
  const int ranges = p.rows * p.chunks;
  const int threads = gridDim.x * gridDim.y * blockDim.x;
  for (int i = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; i < ranges; i += threads) {
    const char* a = static_cast<const char*>(p.base) + (i / p.chunks) * p.row_bytes + (i % p.chunks) * p.chunk_bytes;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(p.bytes) : "memory");
  }
#endif
}

}  // namespace tailserve::cuda
