#pragma once
// Single-row projection for batch-1 decode: y[n] = W[n, k] · x[k] (fp16 W, fp32 accumulate), a warp
// per pair of output columns streaming W in 16-byte loads. At batch 1 the product is bound by
// reading W once, and cuBLAS reached only 2.1-3.5 TB/s on the 8B shape's q/k/v, o and down
// projections. Its epilogue absorbs the small kernels around a projection, which at batch 1 cost as
// much as a projection each (a launch, a drain):
// - RMSNorm of the input: the norm's weight is folded into W's columns at load, and the row's
//   1/rms scales the output, since W·(x·s) = s·(W·x); the sum of squares comes from the Gemv that
//   wrote the residual, or from the x the CTA reads anyway (a column pair's warps cover all of k);
// - bias, and the residual add (beta = 1), also split along k over CTAs that add atomically;
// - the sum of squares of what it writes, for the next norm;
// - SwiGLU, when W's rows interleave gate and up (row 2i gate i, row 2i + 1 up i);
// - RoPE of the q and k heads (decode's q/k/v projection; the attention then writes the new K/V).
// Two or more rows go to cuBLASLt: every extra row re-reads x per W vector from L1, and at 8 rows
// the 8B step took 15.0 ms here against 4.9 through cuBLASLt (bench/CUDA_NOTES.md).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tailserve::cuda {

struct GemvArgs {
  const __half* x = nullptr;     // [k] fp16 input, or
  const float* x_f32 = nullptr;  // [k] fp32 input (the residual stream)
  int k = 0;
  const __half* w = nullptr;  // [n, k]
  int n = 0;
  // Output: y (fp32 [n]) = (W·x) · s + bias + beta · y, or with swiglu
  // act (fp16 [n / 2]) = silu(gate) · up.
  float* y = nullptr;
  float beta = 0.0f;
  const float* bias = nullptr;       // [n]
  __half* swiglu_out = nullptr;
  // RMSNorm of x_f32: s = 1 / sqrt(Σ x² / k + eps), Σ x² from in_sumsq where given, else summed
  // over the x the CTA reads (8 more FMAs a 16-byte x vector: that cost gate/up and the LM head
  // 1-2%, the q/k/v projection nothing measurable); without it s = 1.
  bool rms_norm = false;
  const float* in_sumsq = nullptr;  // [1] Σ x²
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
  // k cut into this many slices, each a CTA of its own that adds its part into y atomically (y
  // only, beta = 1, no norm or RoPE; the bias comes with the first slice). The order of those adds,
  // and so y's last bits, vary from run to run. GemvKSlices gives the engine's choice.
  int k_slices = 1;
};

// CTAs of the Gemv the GPU holds at once (registers allow ~6 per SM), which sets its k split;
// queried once per device, when the preloading kernels' shared-memory carveout is also set. The
// engine asks at start, so no graph capture is the first to.
absl::StatusOr<int> GemvWave();

// The k slices for a residual-adding Gemv over an n × k W: 1 where the whole-k grid already spans
// more than a wave (the block scheduler balances it), otherwise enough for each lane to make two
// steps of W loads a slice, as gate/up's CTAs do. A grid of one wave of long CTAs ends with its
// slowest: the 8B's down at batch 1 spread its CTAs' exits over 3.4 µs (bench/CUDA_NOTES.md).
absl::StatusOr<int> GemvKSlices(int n, int k);

// Requires k % 8 == 0 (16-byte rows), one of x / x_f32, one of y / swiglu_out (with n even); RoPE
// needs y, an even head_dim dividing n and rope_cols (at most n), and rope_pos / rope_inv_freq;
// rms_norm needs x_f32, in_sumsq rms_norm, out_sumsq one k slice.
absl::Status Gemv(const GemvArgs& args, cudaStream_t stream);

}  // namespace tailserve::cuda
