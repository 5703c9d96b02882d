#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/device_info.h"

namespace tailserve {

absl::StatusOr<std::vector<CudaDevice>> ListCudaDevices() {
  int count = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  std::vector<CudaDevice> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, i));
    out.push_back({i, prop.name, prop.major, prop.minor, prop.totalGlobalMem});
  }
  return out;
}

}  // namespace tailserve
