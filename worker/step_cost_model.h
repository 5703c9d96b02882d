#pragma once
// What an engine step costs, learned online from the steps the worker runs: a least-squares fit of
//   seconds = a + b·sequences + c·kv_tokens + p·prefill_tokens
// (the sim's cost model has this form; on a GPU a decode step is bound by weight bytes, so prefill
// tokens ride in it for less than they cost alone, and the fit follows whatever the engine does),
// with exponential forgetting so it tracks a changing machine. The scheduler asks it how many
// prefill tokens fit a step-time target (worker.step_time_target_ms), which turns the fixed
// step-token budget into one that keeps every step, and so every decoding sequence's time per
// output token, within the target while prefilling as much as that allows. Plain C++, one owner
// (the scheduler thread).
#include <array>
#include <cstdint>
#include <optional>

namespace tailserve {

class StepCostModel {
 public:
  struct Fit {
    double a = 0, b = 0, c = 0, p = 0;  // seconds; per sequence, per KV token, per prefill token
  };

  // `forgetting` in (0, 1]: each new step weighs 1 / forgetting times the one before it.
  explicit StepCostModel(double forgetting = 0.998);

  void Observe(int sequences, int64_t kv_tokens, int64_t prefill_tokens, double seconds);
  // The fit once it has seen enough steps, with and without prefill, to tell the terms apart.
  std::optional<Fit> fit() const;
  // The most new tokens a step of `sequences` sequences with `cached_tokens` tokens in the cache
  // can compute beyond them and stay within `target_seconds` (each new token's KV position
  // included); 0 when the step reaches the target without them, nullopt before the fit is ready
  // or when it finds prefill free (no bound).
  std::optional<int64_t> PrefillTokensWithin(double target_seconds, int sequences, int64_t cached_tokens) const;

 private:
  static constexpr int kTerms = 4;
  static constexpr int kMinSteps = 32;
  double forgetting_;
  std::array<std::array<double, kTerms>, kTerms> xtx_{};
  std::array<double, kTerms> xty_{};
  int steps_ = 0, prefill_steps_ = 0, decode_steps_ = 0;
};

}  // namespace tailserve
