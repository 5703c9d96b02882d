#pragma once
// The one checking macro for CUDA runtime calls: a failure becomes an absl::Status naming the call,
// the file and the line. (cuBLAS and NCCL variants join it with the kernels that need them.)
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#define TAILSERVE_CUDA_RETURN_IF_ERROR(call)                                                            \
  do {                                                                                                  \
    const cudaError_t tailserve_err_ = (call);                                                          \
    if (tailserve_err_ != cudaSuccess) {                                                                \
      return absl::InternalError(absl::StrCat(#call, " failed at ", __FILE__, ":", __LINE__, ": ",      \
                                              cudaGetErrorName(tailserve_err_), " (",                   \
                                              cudaGetErrorString(tailserve_err_), ")"));                \
    }                                                                                                   \
  } while (0)
