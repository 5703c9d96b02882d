#pragma once
// What the kernel cases share: device buffers with status-returning copies, seeded inputs and the
// error measures.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/cuda_resources.h"

namespace tailserve::kernel_cases {

template <typename T>
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Of(const std::vector<T>& host) {
    DeviceBuffer b;
    TAILSERVE_ASSIGN_OR_RETURN(b.memory_, DeviceAlloc(std::max<size_t>(host.size(), 1) * sizeof(T)));
    b.n_ = host.size();
    TAILSERVE_RETURN_IF_ERROR(b.Put(host));
    return b;
  }
  static absl::StatusOr<DeviceBuffer> Zeros(size_t n) { return Of(std::vector<T>(n)); }
  T* get() const { return static_cast<T*>(memory_.get()); }
  absl::Status Put(const std::vector<T>& host) {
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<T>> Get() const {
    std::vector<T> host(n_);
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  DeviceMemory memory_;
  size_t n_ = 0;
};

inline std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Rounds v to fp16 in place (the reference then uses the values the GPU reads); returns them as fp16.
inline std::vector<__half> RoundToHalf(std::vector<float>& v) {
  std::vector<__half> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2half(v[i]), v[i] = __half2float(h[i]);
  return h;
}

inline std::vector<float> ToFloats(const std::vector<__half>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = __half2float(v[i]);
  return f;
}

// ‖got − want‖ / ‖want‖.
inline double RelativeL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return got.size() == want.size() ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY;
}

// The worst element's |got − want| / (1 + |want|).
inline double WorstElement(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = got.size() == want.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1.0 + std::abs(double(want[i]))));
  }
  return worst;
}

}  // namespace tailserve::kernel_cases
