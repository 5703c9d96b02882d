#pragma once
// Log-probabilities of the sampled tokens on the GPU: for each row that asks (its SampleParams'
// logprobs), the sampled token's log-softmax over the raw logits and the most likely tokens',
// from one pass over the row. Rows that do not ask return at once, so the op can sit in every
// decode graph.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backends/cuda/kernels/sampling.h"

namespace tailserve::cuda {

inline constexpr int kMaxLogprobAlternatives = 20;

struct RowLogprobs {
  float logprob = 0;  // the sampled token's
  int32_t count = 0;  // alternatives written
  int32_t ids[kMaxLogprobAlternatives] = {};  // most likely first, ties by lower id
  float values[kMaxLogprobAlternatives] = {};
};

// `sampled`: the rows' sampled ids (SampleRows' output, device or mapped host memory). Writes
// out[row] for the rows whose params[row].logprobs > 0 and leaves the others.
absl::Status LogprobRows(const float* logits, int rows, int vocab, const SampleParams* params, const int32_t* sampled,
                         RowLogprobs* out, cudaStream_t stream);

}  // namespace tailserve::cuda
