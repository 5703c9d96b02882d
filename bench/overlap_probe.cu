#include "bench/overlap_probe.h"

#include <cstdint>

#include "worker/backends/cuda/cuda_check.h"

namespace tailserve::bench {
namespace {

constexpr int kThreads = 256, kInFlight = 8;

__global__ void __launch_bounds__(kThreads) StreamReadKernel(const uint4* p, size_t n, unsigned* sink) {
  const size_t stride = size_t(gridDim.x) * kThreads;
  size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x;
  unsigned acc = 0;
  for (; i + (kInFlight - 1) * stride < n; i += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads
}

}  // namespace

absl::Status StreamRead(const void* data, size_t bytes, int ctas, unsigned* sink, cudaStream_t stream) {
  StreamReadKernel<<<ctas, kThreads, 0, stream>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::bench
