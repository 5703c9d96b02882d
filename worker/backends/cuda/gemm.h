#pragma once
// The GEMM every projection uses: Y[rows, n] (fp32) = X[rows, k] (bf16) · W[n, k]ᵀ (bf16, the HF
// nn.Linear layout) + beta · Y, through cuBLAS with fp32 accumulation. beta = 1 fuses the residual
// add into the projection that produces it.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "absl/status/status.h"

namespace tailserve::cuda {

absl::Status Gemm(cublasHandle_t handle, const __nv_bfloat16* x, int rows, int k, const __nv_bfloat16* w, int n,
                  float beta, float* y);

}  // namespace tailserve::cuda
