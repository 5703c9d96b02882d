#pragma once
// Predicted decode steps for each request, and what the router learns from finished ones.
//
// - The ONNX model (predictor.model_path) runs in shadow for the first warmup_steps finished
//   requests, then drives batching; the rule (steps = k * prompt + c) serves until then, when no
//   model is configured, and while drift is active.
// - Calibration: every update_interval_ms, per bucket of raw model prediction (powers of two), the
//   median of actual/predicted over recent feedback becomes that bucket's correction factor.
// - Drift: when the calibrated model's MAPE over drift_window_s exceeds drift_mape_threshold,
//   drift turns on for at least drift_cooldown_s (batching falls back to FIFO, predictions to the
//   rule) and turns off once the window MAPE is back under the threshold.
// Owned by the router core's thread.
#include <array>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>

#include "common/clock.h"
#include "common/config.h"
#include "router/predictor/features.h"
#include "router/predictor/length_model.h"
#include "router/request.h"
#include "router/router_metrics.h"

namespace tailserve {

struct Prediction {
  double steps = 1;          // what batching and the step budget use
  bool from_model = false;   // steps came from the (calibrated) model
  double model_steps = -1;   // the calibrated model's prediction, also in shadow; -1 without a model
  double raw_model_steps = -1;
  FeatureVector features{};
};

FeatureInput FeaturesOf(const ParsedRequest& req);

// The first step budget for a prediction: ceil(steps * (1 + margin)), at least min_step_budget,
// or 0 (no budget) when the margin is negative.
int32_t InitialStepBudget(const PredictorConfig& c, double predicted_steps);

class LengthPredictor {
 public:
  LengthPredictor(const PredictorConfig& config, std::unique_ptr<LengthModel> model, RouterMetrics& metrics,
                  const Clock& clock = SystemClock::Get());

  Prediction Predict(const ParsedRequest& req);
  // A finished request took `actual_steps` decode steps.
  void Feedback(const Prediction& p, int64_t actual_steps);
  // Refreshes calibration and the drift state when update_interval_ms has passed.
  void Tick();
  SteadyTime next_tick() const { return next_tick_; }

  bool drift_active() const { return drift_active_; }
  bool model_in_use() const;
  double window_mape() const;
  int64_t feedback_count() const { return feedback_count_; }

 private:
  static constexpr int kBuckets = 24;
  static int Bucket(double raw);
  double Rule(const ParsedRequest& req) const;

  const PredictorConfig config_;
  std::unique_ptr<LengthModel> model_;
  RouterMetrics& metrics_;
  const Clock& clock_;
  std::ofstream feedback_log_;

  int64_t feedback_count_ = 0;
  std::array<double, kBuckets> correction_;
  std::array<std::deque<double>, kBuckets> ratios_;     // recent actual / raw per bucket
  std::deque<std::pair<SteadyTime, double>> errors_;   // (time, APE of the calibrated model)
  bool drift_active_ = false;
  SteadyTime drift_until_{};
  SteadyTime next_tick_;
};

}  // namespace tailserve
