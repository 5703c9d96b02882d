#pragma once
// The GEMM every projection uses: Y[rows, n] (fp32) = X[rows, k] (fp16) · W[n, k]ᵀ (fp16, the HF
// nn.Linear layout) + beta · Y, through cuBLAS with fp32 accumulation. beta = 1 fuses the residual
// add into the projection that produces it.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "absl/status/status.h"

namespace tailserve::cuda {

// Up to kGemvMaxRows rows (decode) go to the streaming Gemv kernel on `stream` (cuBLAS's stream).
absl::Status Gemm(cublasHandle_t handle, const __half* x, int rows, int k, const __half* w, int n,
                  float beta, float* y);

}  // namespace tailserve::cuda
