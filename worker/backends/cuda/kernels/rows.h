#pragma once
// Per-row elementwise ops of a transformer step: embedding gather, RMSNorm, SwiGLU, bias add and
// the weighted row add that combines MoE experts. Launchers take device pointers, sizes and a
// stream; they never allocate or synchronise.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backends/cuda/kernels/partials.h"

namespace tailserve::cuda {

struct EmbedArgs {
  const __half* table = nullptr;  // [vocab, hidden]
  const int32_t* tokens = nullptr;  // [rows]
  int rows = 0, hidden = 0;
  float* x = nullptr;  // [rows, hidden]
  float* sumsq = nullptr;
  int sumsq_slots = 0;
};

// x[r, :] = float(table[tokens[r], :]); with sumsq, also sumsq[r] = Σ x[r, :]² (what the first
// norm, fused into a Gemv, needs), and sumsq[rows, sumsq_slots) = 0 (the slots later kernels
// accumulate into: a graph then needs no memset before the step).
absl::Status EmbedRows(const EmbedArgs& args, cudaStream_t stream);

// out[r, :] = fp16(x[src[r], :] / rms(x[src[r], :]) * weight); src == nullptr means src[r] = r;
// weight == nullptr means ones (the weight was folded into the consumer's matrix). With `add`
// (at most 4 arrays laid out as x), x[src[r], :] += Σ add[src[r], :] first and is written back: residual
// contributions not yet added into x (a split-K projection's partials, the FFN halves', see
// CudaEngine::Forward). With `add`, the src rows must be distinct (a repeated row would be added
// twice); the engine's are the identity. overlap_previous (also SwiGlu's): launched
// programmatically (common.cuh), it waits for the previous kernel before it reads anything.
// trigger_first: it lets its programmatic follower launch before its own wait, not after, so the
// follower's work before its wait overlaps the kernel before this one too; only for a follower
// whose work before its wait touches nothing that kernel reads or writes (StreamGemm and
// StreamFfn: constant W, and counters no launch before them still uses).
absl::Status RmsNormRows(float* x, const Partials& add, const int32_t* src, int rows, int hidden, const float* weight,
                         float eps, __half* out, cudaStream_t stream, bool overlap_previous = false,
                         bool trigger_first = false);

// out[r, f] = fp16(silu(gate_up[r, 2f]) * gate_up[r, 2f + 1]): gate and up interleaved, as the
// engine lays out its fused gate/up matrix (so a Gemv warp computes both halves of one output).
// Both buffers 16-byte aligned (InvalidArgument otherwise). With `in` (arrays laid out as gate_up,
// a split-K projection's chunks), the input is their sum and gate_up is not read.
absl::Status SwiGlu(const float* gate_up, int rows, int ffn, __half* out, cudaStream_t stream,
                    bool overlap_previous = false, const Partials& in = {});

// x[r, :] += bias.
absl::Status AddBias(float* x, int rows, int n, const float* bias, cudaStream_t stream);

// x[r, :] += weights[r * weight_stride] * y[r, :] (a row whose weight is 0 is left alone).
absl::Status AddScaledRows(float* x, const float* y, const float* weights, int weight_stride, int rows, int n,
                           cudaStream_t stream);

// MoE router logits in fp32 from the fp32 residual: logits[r, e] = rmsnorm(x[r]) · router[e]. Kept
// out of fp16 because top-k routing is discontinuous: a near-tie between two experts must break the
// way fp32 maths (and transformers) breaks it.
absl::Status MoeRouterLogits(const float* x, int rows, int hidden, const float* norm_weight, float eps,
                             const float* router, int experts, float* logits, cudaStream_t stream);

// Mixtral routing: per row, softmax over `experts` logits, keep the top k, renormalise them to sum
// to one; weights[r, e] is that weight, 0 for experts not chosen.
absl::Status MoeRoute(const float* logits, int rows, int experts, int top_k, float* weights, cudaStream_t stream);

}  // namespace tailserve::cuda
