#include "worker/backends/sim/sim_engine.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace tailserve {

double SimStepSeconds(const SimBackendConfig& c, int batch, int64_t kv_tokens, int64_t prefill_tokens) {
  return c.step_base_ms * 1e-3 + c.step_per_sequence_ms * 1e-3 * batch + c.step_per_kv_token_ns * 1e-9 * kv_tokens +
         c.step_per_prefill_token_ms * 1e-3 * prefill_tokens;
}

SimEngine::SimEngine(SimBackendConfig config, std::string model_id, const Clock& clock, SleepFn sleep_until)
    : config_(config), model_id_(std::move(model_id)), clock_(clock), sleep_until_(std::move(sleep_until)) {
  if (!sleep_until_) sleep_until_ = [](SteadyTime t) { std::this_thread::sleep_until(t); };
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
    if (config_.kv_blocks > 0) {
      const auto it = promised_.find(s.id);
      if (it == promised_.end() || it->second * kSimBlockSize < len) {
        return absl::InternalError(absl::StrCat("sim: sequence ", s.id, " computes ", len,
                                                " positions past its KV cache promise"));
      }
    }
    kv_tokens += len;
    // A prefill (whole or a chunk) computes its uncached tokens; a decode computes one.
    if (s.computed == 0 || len - s.computed > 1) prefill_tokens += len - s.computed;
    (*next)[i] = s.chunk() ? -1 : SimToken(s.sampling->seed, len - s.prompt_len, config_.vocab_size);
  }
  const double cost = SimStepSeconds(config_, static_cast<int>(batch.size()), kv_tokens, prefill_tokens);
  if (cost > 0) sleep_until_(start + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(cost)));
  return absl::OkStatus();
}

absl::Status SimEngine::Reserve(uint64_t id, int64_t max_tokens) {
  if (config_.kv_blocks <= 0) return absl::OkStatus();
  const int64_t need = (max_tokens + kSimBlockSize - 1) / kSimBlockSize;
  if (need > config_.kv_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: ", max_tokens, " tokens need ", need,
                                                   " blocks, more than the whole cache holds (", config_.kv_blocks,
                                                   "); lower max_tokens"));
  }
  const auto it = promised_.find(id);
  const int64_t extra = need - (it == promised_.end() ? 0 : it->second);
  if (extra <= 0) return absl::OkStatus();
  if (extra > config_.kv_blocks - used_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", extra, " blocks needed, ", config_.kv_blocks - used_, " free"));
  }
  promised_[id] = need;
  used_ += extra;
  return absl::OkStatus();
}

void SimEngine::Release(uint64_t id) {
  if (auto it = promised_.find(id); it != promised_.end()) {
    used_ -= it->second;
    promised_.erase(it);
  }
}

std::optional<EngineStats> SimEngine::stats() const {
  if (config_.kv_blocks <= 0) return std::nullopt;
  EngineStats s;
  s.kv_blocks_total = config_.kv_blocks;
  s.kv_blocks_free = config_.kv_blocks - used_;
  return s;
}

}  // namespace tailserve
