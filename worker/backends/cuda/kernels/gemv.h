#pragma once
// Small-batch projection: Y[rows, n] (fp32) = X[rows, k] (fp16) · W[n, k]ᵀ (fp16) + beta · Y for
// rows <= 8, a warp per output column streaming W in 16-byte loads. At decode batch sizes the
// product is bound by reading W once, and cuBLAS reached only 2.1-3.5 TB/s on the 8B shape's
// q/k/v, o and down projections at batch 1.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace tailserve::cuda {

inline constexpr int kGemvMaxRows = 8;

// Requires rows <= kGemvMaxRows and k % 8 == 0 (16-byte rows).
absl::Status Gemv(const __half* x, int rows, int k, const __half* w, int n, float beta, float* y, cudaStream_t stream);

}  // namespace tailserve::cuda
