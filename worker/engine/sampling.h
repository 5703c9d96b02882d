#pragma once
// Token sampling from logits: greedy, temperature, top-k, top-p. Randomness is a pure function of
// (seed, position), so a seeded request gives the same tokens whatever it is batched with and
// after a re-dispatch to another worker.
#include <cstdint>
#include <span>
#include <vector>

#include "common/splitmix.h"  // SampleUniform
#include "worker/engine/engine.h"

namespace tailserve {

// `position`: index of the token being chosen within its sequence. `scratch` is reused between
// calls to avoid allocating per token.
int32_t SampleToken(std::span<const float> logits, const Sampling& sampling, int64_t position,
                    std::vector<std::pair<float, int32_t>>* scratch);

// `token`'s log-probability under `logits` (log-softmax, fp64 sums) and the `top` most likely
// tokens' into *out. Non-finite logits count as probability 0 and are never listed.
void ComputeLogprobs(std::span<const float> logits, int32_t token, int32_t top, TokenLogprobs* out);

}  // namespace tailserve
