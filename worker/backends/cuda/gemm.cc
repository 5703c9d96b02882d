#include "worker/backends/cuda/gemm.h"

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/gemv.h"

namespace tailserve::cuda {

absl::Status Gemm(cublasHandle_t handle, const __half* x, int rows, int k, const __half* w, int n,
                  float beta, float* y) {
  if (rows == 0) return absl::OkStatus();
  if (rows <= kGemvMaxRows && k % 8 == 0) {
    cudaStream_t stream;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cublasGetStream(handle, &stream));
    return Gemv({.x = x, .rows = rows, .k = k, .w = w, .n = n, .y = y, .beta = beta}, stream);
  }
  const float alpha = 1.0f;
  // Column-major view: Yᵀ[n, rows] = W[n, k] (stored k-major, so op T) · Xᵀ[k, rows].
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha, w, CUDA_R_16F, k,
                                              x, CUDA_R_16F, k, &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
