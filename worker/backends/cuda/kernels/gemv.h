#pragma once
// Single-row projection for batch-1 decode: y[n] = W[n, k] · x[k] (fp16 W, fp32 accumulate), a warp
// per pair of output columns streaming W in 16-byte loads. At batch 1 the product is bound by
// reading W once, and cuBLAS reached only 2.1-3.5 TB/s on the 8B shape's q/k/v, o and down
// projections. Its epilogue absorbs the small kernels around a projection, which at batch 1 cost as
// much as a projection each (a launch, a drain):
// - RMSNorm of the input: the norm's weight is folded into W's columns at load, and the row's
//   1/rms (from a sum of squares its producer accumulated) scales the output, since W·(x·s) = s·(W·x);
// - bias, and the residual add (beta = 1);
// - the sum of squares of what it writes, for the next norm;
// - SwiGLU, when W's rows interleave gate and up (row 2i gate i, row 2i + 1 up i);
// - RoPE of the q and k heads (decode's q/k/v projection; the attention then writes the new K/V).
// Two or more rows go to cuBLASLt: every extra row re-reads x per W vector from L1, and at 8 rows
// the 8B step took 15.0 ms here against 4.9 through cuBLASLt (docs/cuda-decode.md).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tailserve::cuda {

struct GemvArgs {
  const __half* x = nullptr;     // [k] fp16 input, or
  const float* x_f32 = nullptr;  // [k] fp32 input (the residual stream, normed by in_sumsq)
  int k = 0;
  const __half* w = nullptr;  // [n, k]
  int n = 0;
  // Output: y (fp32 [n]) = (W·x) · s + bias + beta · y, or with swiglu
  // act (fp16 [n / 2]) = silu(gate) · up.
  float* y = nullptr;
  float beta = 0.0f;
  const float* bias = nullptr;       // [n]
  __half* swiglu_out = nullptr;
  const float* in_sumsq = nullptr;   // [1] Σ x²: s = 1 / sqrt(Σ x² / k + eps); absent: s = 1
  float eps = 0.0f;
  float* out_sumsq = nullptr;        // [1] += Σ over the written y of y² (zeroed by the caller)
  // RoPE (the q/k/v projection; y only): with rope_head_dim > 0 a warp's two columns are i and
  // i + head_dim / 2 of one head rather than neighbours, and below rope_cols (the q and k heads)
  // they leave rotated by the angle *rope_pos · rope_inv_freq[i] (rotate-half, after the bias).
  int rope_head_dim = 0;
  int rope_cols = 0;
  const int32_t* rope_pos = nullptr;
  const float* rope_inv_freq = nullptr;  // [rope_head_dim / 2]
  // Launched with programmatic stream serialization (on a non-default stream): CTAs start while
  // the previous kernel finishes and wait for it before reading anything.
  bool overlap_previous = false;
  // Copy each lane's first W loads (up to 32 KB a CTA) into shared memory before that wait: worth
  // it where the previous kernel leaves DRAM idle (the attention before the batch-1 o Gemv).
  bool preload_w = false;
  // The k split (1, 2, 4 or 8 warps a column pair); 0: Gemv's rule (gemv.cu). For the kernel
  // bench's sweep.
  int k_split = 0;
};

// CTAs of the Gemv the GPU holds at once (registers allow ~6 per SM), which sets its k split
// (grids within its 64-register instances' 4 an SM take those, with more W loads in flight);
// queried once per device, when the preloading kernels' shared-memory carveout is also set. The
// engine asks at start, so no graph capture is the first to.
absl::StatusOr<int> GemvWave();

// Requires k % 8 == 0 (16-byte rows), one of x / x_f32, one of y / swiglu_out (with n even); RoPE
// needs y, an even head_dim dividing n and rope_cols (at most n), and rope_pos / rope_inv_freq.
absl::Status Gemv(const GemvArgs& args, cudaStream_t stream);

}  // namespace tailserve::cuda
