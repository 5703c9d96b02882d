#include "router/predictor.h"

#include <algorithm>
#include <cmath>

namespace tailserve {

double RulePredictor::PredictSteps(const ParsedRequest& req) const {
  const double p = config_.steps_per_prompt_token * static_cast<double>(req.prompt.size()) + config_.base_steps;
  return std::clamp(p, 1.0, static_cast<double>(req.max_tokens));
}

int32_t InitialStepBudget(const PredictorConfig& c, double predicted_steps) {
  if (c.step_budget_margin < 0) return 0;
  const double b = std::ceil(predicted_steps * (1.0 + c.step_budget_margin));
  return std::max<int32_t>(c.min_step_budget, static_cast<int32_t>(std::min(b, 1e9)));
}

}  // namespace tailserve
