#pragma once
// The one checking macro family for CUDA runtime and cuBLAS calls: a failure becomes an
// absl::Status naming the call, the file and the line.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tailserve::cuda_internal {

inline absl::Status CallError(const char* call, const char* file, int line, const char* name, const char* what) {
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ", name, " (", what, ")"));
}
inline const char* ErrorName(cudaError_t e) { return cudaGetErrorName(e); }
inline const char* ErrorText(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* ErrorName(cublasStatus_t s) { return cublasGetStatusName(s); }
inline const char* ErrorText(cublasStatus_t s) { return cublasGetStatusString(s); }
inline bool Failed(cudaError_t e) { return e != cudaSuccess; }
inline bool Failed(cublasStatus_t s) { return s != CUBLAS_STATUS_SUCCESS; }

}  // namespace tailserve::cuda_internal

// Works for cudaError_t and cublasStatus_t results.
#define TAILSERVE_CUDA_RETURN_IF_ERROR(call)                                                              \
  do {                                                                                                    \
    const auto tailserve_err_ = (call);                                                                   \
    if (::tailserve::cuda_internal::Failed(tailserve_err_)) {                                             \
      return ::tailserve::cuda_internal::CallError(#call, __FILE__, __LINE__,                             \
                                                   ::tailserve::cuda_internal::ErrorName(tailserve_err_), \
                                                   ::tailserve::cuda_internal::ErrorText(tailserve_err_)); \
    }                                                                                                     \
  } while (0)

// After a kernel launch: the launch error, if any (faults inside the kernel surface at the next sync).
#define TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR() TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetLastError())
