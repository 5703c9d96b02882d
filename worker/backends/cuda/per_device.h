#pragma once
// A launch parameter computed once per CUDA device: SM counts, occupancy waves and function
// attributes belong to a device (cudaFuncSetAttribute sets them for the current device's copy of
// the kernel), so an engine on a second GPU must not reuse the first one's. Plain C++ header.
#include <cuda_runtime_api.h>

#include <atomic>
#include <utility>

#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_check.h"

namespace tailserve::cuda {

class PerDeviceInt {
 public:
  // The value for the calling thread's current device: `compute()` (an absl::StatusOr<int> of a
  // positive value) the first time, the cached value after. Failures are not cached; two threads
  // may both compute it the first time, which is harmless for idempotent attribute calls.
  template <typename Compute>
  absl::StatusOr<int> Get(Compute&& compute) {
    int device = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    if (device < 0 || device >= kDevices) return std::forward<Compute>(compute)();
    if (const int v = values_[device].load(std::memory_order_acquire); v > 0) return v;
    absl::StatusOr<int> v = std::forward<Compute>(compute)();
    if (v.ok()) values_[device].store(*v, std::memory_order_release);
    return v;
  }

 private:
  static constexpr int kDevices = 64;
  std::atomic<int> values_[kDevices] = {};
};

// The current device's SM count, cached per device (the persistent kernels size their grids by it).
inline absl::StatusOr<int> CurrentDeviceSmCount() {
  static PerDeviceInt sms;
  return sms.Get([]() -> absl::StatusOr<int> {
    int device = 0, n = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  });
}

}  // namespace tailserve::cuda
