#pragma once
// The backend interface the worker scheduler drives. The scheduler owns slots and sequences; the
// backend owns its cache layout. Backends: sim (cost model), cpu (fp32 reference), cuda.
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tailserve {

class KvEventLog;

struct Sampling {
  float temperature = 0;  // 0: greedy
  float top_p = 1;
  int32_t top_k = 0;
  uint64_t seed = 0;
  // -1: no log-probabilities; 0..kMaxTopLogprobs: the sampled token's and this many most likely.
  int32_t top_logprobs = -1;
};

inline constexpr int32_t kMaxTopLogprobs = 20;

// A sampled token's log-probability under the model (log-softmax of the raw logits, before
// temperature, top-k and top-p) and the `top_logprobs` most likely tokens' (most likely first,
// ties by lower id).
struct TokenLogprobs {
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// One sequence's view for one step. `tokens` holds prompt then generated tokens; the first
// `computed` of them are already in the backend's cache, the rest go through the model now
// (all of them for a new or re-dispatched sequence: a prefill; only the last one when decoding).
// With `end` > 0 the step is a prefill chunk: only tokens [computed, end) go through the model
// (end < tokens->size()), into the cache, and nothing is sampled (a step-token budget splits a
// long prompt over several steps, so decoding sequences never wait for a whole prefill).
struct StepSequence {
  uint64_t id = 0;
  const std::vector<int32_t>* tokens = nullptr;
  int32_t prompt_len = 0;
  int32_t computed = 0;
  const Sampling* sampling = nullptr;
  int32_t end = 0;
  // Where the step writes the sampled token's log-probabilities (sampling->top_logprobs >= 0);
  // null: not asked. A chunk writes none.
  TokenLogprobs* logprobs = nullptr;

  bool chunk() const { return end > 0; }
  // Tokens in the cache after the step.
  int32_t computed_after() const { return chunk() ? end : static_cast<int32_t>(tokens->size()); }
};

// INVALID_ARGUMENT for a prefill chunk that ends at or before what is cached, or at or past the
// last token (a chunk never samples, so the last token is always left for a full step).
inline absl::Status CheckChunk(const StepSequence& s) {
  if (s.chunk() && (s.end <= s.computed || s.end >= static_cast<int64_t>(s.tokens->size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", s.id, ": a prefill chunk must end past ", s.computed, " and before the last token"));
  }
  return absl::OkStatus();
}

// What a backend reports about its device state (exported as worker metrics).
struct EngineStats {
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_cached = 0;   // free blocks that still hold a cached prefix (counted in free)
  int64_t kv_evictions = 0;       // cached blocks evicted for new ones (cumulative)
  int64_t kv_clamps = 0;      // KV values clamped to the cache dtype's range (cumulative)
  int64_t graph_replays = 0;  // decode steps run as one graph replay (cumulative)
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string backend() const = 0;
  virtual std::string model_id() const = 0;
  // True when tokens are not model output (the simulator).
  virtual bool simulated() const = 0;
  virtual int32_t vocab_size() const = 0;
  // Longest sequence (prompt + generated) the model can hold.
  virtual int32_t max_context() const { return std::numeric_limits<int32_t>::max(); }
  // Token ids that end a sequence (generation_config.json), added to every request's stop ids.
  virtual std::vector<int32_t> eos_token_ids() const { return {}; }
  // Runs the model over each sequence's uncomputed tokens (a chunk's up to its end) and samples one
  // next token per sequence, written to (*next)[i] for batch[i] (-1 for a chunk, which samples none).
  virtual absl::Status Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) = 0;
  // Hold room for a sequence of up to `max_tokens` tokens (prompt included), so a step never
  // finds the cache full: at admission, and again with more as the sequence grows (the room
  // grows; asking for less than it holds changes nothing). RESOURCE_EXHAUSTED when it does not fit
  // now, INVALID_ARGUMENT when it never will; Release returns the room.
  virtual absl::Status Reserve(uint64_t /*id*/, int64_t /*max_tokens*/) { return absl::OkStatus(); }
  // Prefix caching: attaches to the new sequence `id` the longest run of cached KV blocks its
  // `tokens` begin with (always leaving the last token to compute) and returns how many tokens that
  // covers, which then need no compute; 0 for a backend without a prefix cache. Release detaches.
  virtual absl::StatusOr<int32_t> AttachCachedPrefix(uint64_t /*id*/, std::span<const int32_t> /*tokens*/) {
    return 0;
  }
  // The prefix cache's stream of stored and evicted blocks (KvEventLog, safe from any thread);
  // null without a prefix cache.
  virtual const KvEventLog* kv_events() const { return nullptr; }
  // The sequence is over (finished, cancelled or handed back): free what the backend holds for it.
  virtual void Release(uint64_t id) = 0;
  // Device state, for backends that have one.
  virtual std::optional<EngineStats> stats() const { return std::nullopt; }
};

}  // namespace tailserve
