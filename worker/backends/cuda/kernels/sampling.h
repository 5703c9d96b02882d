#pragma once
// Token sampling on the GPU, so only token ids come back: greedy, temperature, top-k, top-p, with
// the same (seed, position) randomness as the CPU sampler. One CTA per row.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tailserve::cuda {

struct SampleParams {
  float temperature = 0;  // <= 0: greedy
  float top_p = 1;
  int32_t top_k = 0;      // 0: all
  int32_t logprobs = 0;   // 0: none; 1 + n: the sampled token's log-probability and the n most likely (LogprobRows)
  uint64_t seed = 0;
  int64_t position = 0;   // index of the token being chosen within its sequence
};

// overlap_previous: launched with programmatic stream serialization, waiting for the previous
// kernel (the LM head) before it reads anything.
absl::Status SampleRows(const float* logits, int rows, int vocab, const SampleParams* params, int32_t* out,
                        cudaStream_t stream, bool overlap_previous = false);

}  // namespace tailserve::cuda
