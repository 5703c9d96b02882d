#pragma once
// What CUDA devices this process sees. Plain C++ header: callers build without nvcc.
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tailserve {

struct CudaDevice {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t total_memory = 0;
};

// The visible devices; an error (e.g. no driver) when CUDA cannot be initialised.
absl::StatusOr<std::vector<CudaDevice>> ListCudaDevices();

}  // namespace tailserve
