#pragma once
// The decode projection for 2..16 rows on the tensor cores: Y[r, n] = X[r, k] · W[n, k]ᵀ with fp16
// inputs and fp32 accumulation, streaming W once. A warp takes 16 output columns (W's rows are
// mma's A, the 16 rows of X its two n-halves of B) and streams them with X through a private ring
// in shared memory, one bulk copy a row (cp.async.bulk onto an mbarrier): the bytes in flight cost
// no registers (what held five register-fed designs below cuBLASLt, bench/CUDA_NOTES.md) and no
// barrier joins a CTA's warps until the epilogue. The epilogue takes the kernels around a
// projection, as the batch-1 Gemv's does (gemv.h):
// - RMSNorm of the input: X is the unnormalised residual in fp16 (the norm's weight folded into W),
//   and each row's 1/rms, from the sum of squares its producer accumulated, scales the output;
// - bias, and the residual add (beta = 1), with an fp16 copy of what it writes for the next
//   projection and each row's sum of squares for the next norm;
// - SwiGLU, with W's rows in tiles of 16: 8 gate rows, then the 8 matching up rows.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace tailserve::cuda {

inline constexpr int kMmaGemvMaxRows = 16;

struct MmaGemvArgs {
  const __half* x = nullptr;  // [rows, k] fp16
  int rows = 0;               // 1..16
  int k = 0;
  const __half* w = nullptr;  // [n, k]
  int n = 0;
  // Output: y (fp32 [rows, n]) = (X·Wᵀ)·s + bias + beta·y, and y16 (fp16 [rows, n], optional) the
  // same saturated to ±65504; or with swiglu_out (fp16 [rows, n / 2]) silu(gate)·up.
  float* y = nullptr;
  float beta = 0.0f;
  const float* bias = nullptr;  // [n]
  __half* y16 = nullptr;
  __half* swiglu_out = nullptr;
  const float* in_sumsq = nullptr;  // [rows] Σ x²: row r's s = 1 / sqrt(in_sumsq[r] / k + eps); absent: s = 1
  float eps = 0.0f;
  float* out_sumsq = nullptr;       // [rows] += Σ over row r's written y of y² (zeroed by the caller)
  // Programmatic stream serialization (non-default stream): CTAs start while the previous kernel
  // finishes, load their first W before the wait, and read X only after it.
  bool overlap_previous = false;
  // Warps of a CTA that split a tile's k (1, 2 or 4); 0 picks it from the shape. For the benchmark.
  int split = 0;
};

// Requires 1 <= rows <= 16, k % 8 == 0 (16-byte rows), one of y / swiglu_out (with n % 16 == 0),
// y16 only with y.
absl::Status MmaGemv(const MmaGemvArgs& args, cudaStream_t stream);

}  // namespace tailserve::cuda
