#include "router/length_predictor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace tailserve {
namespace {

constexpr size_t kRatiosPerBucket = 512;
constexpr size_t kMinRatiosForCorrection = 16;

}  // namespace

FeatureInput FeaturesOf(const ParsedRequest& req) {
  FeatureInput f;
  f.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  f.non_alnum_ratio = req.non_alnum_ratio;
  f.max_tokens = req.max_tokens;
  f.priority = static_cast<int>(req.priority);
  f.has_stop = !req.stop.empty() || !req.stop_token_ids.empty();
  f.temperature = req.sampling.temperature();
  return f;
}

int32_t InitialStepBudget(const PredictorConfig& c, double predicted_steps) {
  if (c.step_budget_margin < 0) return 0;
  const double b = std::ceil(predicted_steps * (1.0 + c.step_budget_margin));
  return std::max<int32_t>(c.min_step_budget, static_cast<int32_t>(std::min(b, 1e9)));
}

LengthPredictor::LengthPredictor(const PredictorConfig& config, std::unique_ptr<LengthModel> model,
                                 RouterMetrics& metrics, const Clock& clock)
    : config_(config), model_(std::move(model)), metrics_(metrics), clock_(clock) {
  correction_.fill(1.0);
  next_tick_ = clock_.Now() + std::chrono::milliseconds(config_.update_interval_ms);
  if (!config_.feedback_log.empty()) {
    feedback_log_.open(config_.feedback_log, std::ios::app);
    if (!feedback_log_) spdlog::error("cannot open predictor.feedback_log {}", config_.feedback_log);
  }
  metrics_.drift_active.Set(0);
}

int LengthPredictor::Bucket(double raw) {
  return std::clamp(static_cast<int>(std::log2(std::max(raw, 0.0) + 1.0)), 0, kBuckets - 1);
}

double LengthPredictor::Rule(const ParsedRequest& req) const {
  return config_.steps_per_prompt_token * static_cast<double>(req.prompt.size()) + config_.base_steps;
}

bool LengthPredictor::model_in_use() const {
  return model_ && !drift_active_ && feedback_count_ >= config_.warmup_steps;
}

Prediction LengthPredictor::Predict(const ParsedRequest& req) {
  Prediction p;
  p.features = MakeFeatures(FeaturesOf(req));
  const double cap = std::max(1, req.max_tokens);
  if (model_) {
    absl::StatusOr<float> raw = model_->Predict(p.features);
    if (raw.ok() && std::isfinite(*raw)) {
      p.raw_model_steps = std::max(0.0f, *raw);
      p.model_steps = std::clamp(p.raw_model_steps * correction_[Bucket(p.raw_model_steps)], 1.0, cap);
    }
  }
  p.from_model = model_in_use() && p.model_steps > 0;
  p.steps = p.from_model ? p.model_steps : std::clamp(Rule(req), 1.0, cap);
  metrics_.predictions.Labels({p.from_model ? "model" : "rule"}).Inc();
  return p;
}

void LengthPredictor::Feedback(const Prediction& p, int64_t actual_steps) {
  if (actual_steps <= 0) return;
  ++feedback_count_;
  const double actual = static_cast<double>(actual_steps);
  metrics_.predictor_abs_error.Observe(std::abs(p.steps - actual));
  if (p.raw_model_steps > 0) {
    auto& q = ratios_[Bucket(p.raw_model_steps)];
    q.push_back(actual / p.raw_model_steps);
    if (q.size() > kRatiosPerBucket) q.pop_front();
  }
  if (p.model_steps > 0) errors_.emplace_back(clock_.Now(), std::abs(p.model_steps - actual) / actual);
  if (feedback_log_.is_open()) {
    nlohmann::json features;
    for (int k = 0; k < kNumFeatures; ++k) features[kFeatureNames[k]] = p.features[k];
    feedback_log_ << nlohmann::json{{"features", features}, {"actual_steps", actual_steps}, {"predicted", p.steps}}.dump()
                  << "\n";
  }
}

double LengthPredictor::window_mape() const {
  if (errors_.empty()) return 0;
  double sum = 0;
  for (const auto& [t, e] : errors_) sum += e;
  return sum / static_cast<double>(errors_.size());
}

void LengthPredictor::Tick() {
  const SteadyTime now = clock_.Now();
  if (now < next_tick_) return;
  next_tick_ = now + std::chrono::milliseconds(config_.update_interval_ms);
  if (feedback_log_.is_open()) feedback_log_.flush();

  for (int b = 0; b < kBuckets; ++b) {
    if (ratios_[b].size() < kMinRatiosForCorrection) continue;
    std::vector<double> r(ratios_[b].begin(), ratios_[b].end());
    std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
    correction_[b] = std::clamp(r[r.size() / 2], 0.05, 20.0);
  }

  const auto window = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(config_.drift_window_s));
  while (!errors_.empty() && errors_.front().first + window < now) errors_.pop_front();
  const double mape = window_mape();
  const bool enough = static_cast<int64_t>(errors_.size()) >= config_.drift_min_samples;
  metrics_.predictor_window_mape.Set(mape);
  if (!drift_active_ && enough && mape > config_.drift_mape_threshold) {
    drift_active_ = true;
    drift_until_ = now + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(config_.drift_cooldown_s));
    metrics_.drift_events.Inc();
    spdlog::warn("predictor drift: window MAPE {:.0f}% over {} requests > {:.0f}%: FIFO batching and rule predictions",
                 100 * mape, errors_.size(), 100 * config_.drift_mape_threshold);
  } else if (drift_active_ && now >= drift_until_ && (!enough || mape <= config_.drift_mape_threshold)) {
    drift_active_ = false;
    spdlog::info("predictor recovered: window MAPE {:.0f}%: length-aware batching again", 100 * mape);
  }
  metrics_.drift_active.Set(drift_active_ ? 1 : 0);
}

}  // namespace tailserve
