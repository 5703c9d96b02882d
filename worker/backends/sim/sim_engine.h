#pragma once
// The simulator backend: no model math. Each step sleeps for the cost model
//   step = a + b*batch + c*kv_tokens + p*prefill_tokens
// (constants from config, fitted on a GPU) and emits deterministic pseudo-random tokens that depend
// only on (seed, output position), so a re-dispatched sequence continues exactly where it stopped.
#include <functional>
#include <memory>

#include "common/clock.h"
#include "common/config.h"
#include "common/sim_token.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_block_allocator.h"

namespace tailserve {


// Cost of one step in seconds under the model.
double SimStepSeconds(const SimBackendConfig& c, int batch, int64_t kv_tokens, int64_t prefill_tokens);

class SimEngine final : public Engine {
 public:
  // `sleep_until` is injectable so tests run the cost model without waiting.
  using SleepFn = std::function<void(SteadyTime)>;
  SimEngine(SimBackendConfig config, std::string model_id, const Clock& clock = SystemClock::Get(),
            SleepFn sleep_until = nullptr, bool prefix_caching = false);

  std::string backend() const override { return "sim"; }
  std::string model_id() const override { return model_id_; }
  bool simulated() const override { return true; }
  int32_t vocab_size() const override { return config_.vocab_size; }
  absl::Status Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) override;
  // With worker.sim.kv_blocks set, a paged cache of that many blocks of kSimBlockSize positions
  // is accounted by the CUDA engine's allocator (no device memory): promises grow, Release frees,
  // a step past a sequence's promise fails as the CUDA engine's would, and with prefix caching a
  // sequence attaches cached blocks and the cost model charges only the tokens it computes.
  // 0: unlimited, no prefix cache.
  absl::Status Reserve(uint64_t id, int64_t max_tokens) override;
  absl::StatusOr<int32_t> AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens) override;
  void Release(uint64_t id) override;
  std::optional<EngineStats> stats() const override;
  static constexpr int64_t kSimBlockSize = 16;

  const KvEventLog* kv_events() const override { return blocks_ ? blocks_->events() : nullptr; }

 private:
  const SimBackendConfig config_;
  std::unique_ptr<KvBlockAllocator> blocks_;  // with kv_blocks
  const std::string model_id_;
  const Clock& clock_;
  SleepFn sleep_until_;
  int64_t steps_ = 0;
};

}  // namespace tailserve
