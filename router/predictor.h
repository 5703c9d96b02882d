#pragma once
// Predicts how many decode steps a request needs. The rule-based predictor is the fallback the
// ONNX model (length-aware batching) replaces; both sit behind this interface.
#include "common/config.h"
#include "router/request.h"

namespace tailserve {

class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual double PredictSteps(const ParsedRequest& req) const = 0;
};

class RulePredictor final : public Predictor {
 public:
  explicit RulePredictor(const PredictorConfig& c) : config_(c) {}
  double PredictSteps(const ParsedRequest& req) const override;

 private:
  const PredictorConfig config_;
};

// The first step budget for a prediction: ceil(pred * (1 + margin)), at least min_step_budget,
// or 0 (no budget) when the margin is negative.
int32_t InitialStepBudget(const PredictorConfig& c, double predicted_steps);

}  // namespace tailserve
