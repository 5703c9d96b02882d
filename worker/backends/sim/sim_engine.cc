#include "worker/backends/sim/sim_engine.h"

#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"

namespace tailserve {

double SimStepSeconds(const SimBackendConfig& c, int batch, int64_t kv_tokens, int64_t prefill_tokens) {
  return c.step_base_ms * 1e-3 + c.step_per_sequence_ms * 1e-3 * batch + c.step_per_kv_token_ns * 1e-9 * kv_tokens +
         c.step_per_prefill_token_ms * 1e-3 * prefill_tokens;
}

SimEngine::SimEngine(SimBackendConfig config, std::string model_id, const Clock& clock, SleepFn sleep_until,
                     bool prefix_caching)
    : config_(config), model_id_(std::move(model_id)), clock_(clock), sleep_until_(std::move(sleep_until)) {
  if (!sleep_until_) sleep_until_ = [](SteadyTime t) { std::this_thread::sleep_until(t); };
  if (config_.kv_blocks > 0) {
    // Block 0 is the allocator's trash block: one more, so kv_blocks can be handed out.
    const int max_blocks = config_.kv_blocks;
    std::optional<uint64_t> salt;
    if (prefix_caching) salt = BlockHashSalt(std::string_view(absl::StrCat("sim|", model_id_)));
    blocks_ = std::make_unique<KvBlockAllocator>(static_cast<int64_t>(config_.kv_blocks) + 1, kSimBlockSize, max_blocks,
                                                 0, static_cast<int64_t>(max_blocks) * kSimBlockSize,
                                                 std::span<int32_t>(), salt);
  }
}

absl::Status SimEngine::Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) {
  if (config_.fail_after_steps > 0 && ++steps_ > config_.fail_after_steps) {
    return absl::InternalError("sim: injected device fault (worker.sim.fail_after_steps)");
  }
  const SteadyTime start = clock_.Now();
  int64_t kv_tokens = 0, prefill_tokens = 0;
  next->resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepSequence& s = batch[i];
    const int64_t len = s.computed_after();
    if (blocks_) {
      KvBlockAllocator::Sequence* kv = blocks_->Find(s.id);
      const int64_t held = kv ? static_cast<int64_t>(kv->blocks.size()) + kv->reserved : 0;
      if (held * kSimBlockSize < len || !blocks_->EnsurePositions(*kv, len).ok()) {
        return absl::InternalError(absl::StrCat("sim: sequence ", s.id, " computes ", len,
                                                " positions past its KV cache promise"));
      }
      blocks_->PublishComputed(*kv, *s.tokens, len);
    }
    kv_tokens += len;
    // A prefill (whole or a chunk) computes its uncached tokens; a decode computes one.
    if (s.computed == 0 || len - s.computed > 1) prefill_tokens += len - s.computed;
    (*next)[i] = s.chunk() ? -1 : SimToken(s.sampling->seed, len - s.prompt_len, config_.vocab_size);
    if (s.logprobs && !s.chunk()) {  // the simulator's token is certain: log 1, and nothing else is possible
      s.logprobs->logprob = 0;
      s.logprobs->top.clear();
      if (s.sampling->top_logprobs > 0) s.logprobs->top.emplace_back((*next)[i], 0.0f);
    }
  }
  const double cost = SimStepSeconds(config_, static_cast<int>(batch.size()), kv_tokens, prefill_tokens);
  if (cost > 0) sleep_until_(start + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(cost)));
  return absl::OkStatus();
}

absl::Status SimEngine::Reserve(uint64_t id, int64_t max_tokens) {
  return blocks_ ? blocks_->Reserve(id, max_tokens) : absl::OkStatus();
}

absl::StatusOr<int32_t> SimEngine::AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens) {
  if (!blocks_ || !blocks_->prefix_caching()) return 0;
  absl::StatusOr<int64_t> hit = blocks_->AttachCachedPrefix(id, tokens);
  if (!hit.ok()) return hit.status();
  return static_cast<int32_t>(*hit);
}

void SimEngine::Release(uint64_t id) {
  if (blocks_) blocks_->Release(id);
}

std::optional<EngineStats> SimEngine::stats() const {
  if (!blocks_) return std::nullopt;
  EngineStats s;
  s.kv_blocks_total = config_.kv_blocks;
  s.kv_blocks_free = blocks_->unpromised_blocks();
  s.kv_blocks_cached = blocks_->cached_blocks();
  s.kv_evictions = blocks_->evictions();
  return s;
}

}  // namespace tailserve
