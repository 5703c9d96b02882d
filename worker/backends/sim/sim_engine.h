#pragma once
// The simulator backend: no model math. Each step sleeps for the cost model
//   step = a + b*batch + c*kv_tokens + p*prefill_tokens
// (constants from config, fitted on a GPU) and emits deterministic pseudo-random tokens that depend
// only on (seed, output position), so a re-dispatched sequence continues exactly where it stopped.
#include <functional>

#include "common/clock.h"
#include "common/config.h"
#include "common/sim_token.h"
#include "worker/engine/engine.h"

namespace tailserve {


// Cost of one step in seconds under the model.
double SimStepSeconds(const SimBackendConfig& c, int batch, int64_t kv_tokens, int64_t prefill_tokens);

class SimEngine final : public Engine {
 public:
  // `sleep_until` is injectable so tests run the cost model without waiting.
  using SleepFn = std::function<void(SteadyTime)>;
  SimEngine(SimBackendConfig config, std::string model_id, const Clock& clock = SystemClock::Get(),
            SleepFn sleep_until = nullptr);

  std::string backend() const override { return "sim"; }
  std::string model_id() const override { return model_id_; }
  bool simulated() const override { return true; }
  int32_t vocab_size() const override { return config_.vocab_size; }
  absl::Status Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) override;
  void Release(uint64_t) override {}

 private:
  const SimBackendConfig config_;
  const std::string model_id_;
  const Clock& clock_;
  SleepFn sleep_until_;
  int64_t steps_ = 0;
};

}  // namespace tailserve
