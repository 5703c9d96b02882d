// LengthPredictor: rule fallback, shadow warm-up, per-bucket calibration, drift on and off.
#include "router/length_predictor.h"

#include <gtest/gtest.h>

namespace tailserve {
namespace {

// A model that always predicts `value` steps.
class ConstantModel final : public LengthModel {
 public:
  explicit ConstantModel(float value) : value_(value) {}
  absl::StatusOr<float> Predict(std::span<const float>) const override { return value_; }
  std::string Describe() const override { return "constant"; }

 private:
  float value_;
};

class LengthPredictorTest : public ::testing::Test {
 protected:
  LengthPredictorTest() : metrics_(registry_, 60) {
    config_.steps_per_prompt_token = 0.5;
    config_.base_steps = 4;
    config_.warmup_steps = 10;
    config_.update_interval_ms = 1000;
    config_.drift_mape_threshold = 0.3;
    config_.drift_window_s = 60;
    config_.drift_cooldown_s = 120;
    config_.drift_min_samples = 20;
  }
  ParsedRequest Req(int prompt, int max_tokens = 1000) {
    ParsedRequest r;
    r.prompt.assign(prompt, 1);
    r.max_tokens = max_tokens;
    return r;
  }
  double Metric(const std::string& series) {
    const std::string text = registry_.Serialize();
    const size_t at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 2));
  }
  void Tick() {
    clock_.Advance(std::chrono::milliseconds(config_.update_interval_ms));
    predictor_->Tick();
  }
  void Start(std::unique_ptr<LengthModel> model) {
    predictor_ = std::make_unique<LengthPredictor>(config_, std::move(model), metrics_, clock_);
  }

  PredictorConfig config_;
  Registry registry_;
  RouterMetrics metrics_;
  FakeClock clock_;
  std::unique_ptr<LengthPredictor> predictor_;
};

TEST_F(LengthPredictorTest, RuleWithoutModelClampedToMaxTokens) {
  Start(nullptr);
  EXPECT_DOUBLE_EQ(predictor_->Predict(Req(100)).steps, 54);
  EXPECT_DOUBLE_EQ(predictor_->Predict(Req(100, 20)).steps, 20);
  EXPECT_FALSE(predictor_->Predict(Req(100)).from_model);
  EXPECT_EQ(predictor_->Predict(Req(100)).model_steps, -1);
}

TEST_F(LengthPredictorTest, ModelRunsInShadowDuringWarmupThenDrives) {
  Start(std::make_unique<ConstantModel>(30));
  for (int i = 0; i < 10; ++i) {
    const Prediction p = predictor_->Predict(Req(100));
    EXPECT_FALSE(p.from_model) << i;
    EXPECT_DOUBLE_EQ(p.steps, 54);        // the rule drives
    EXPECT_DOUBLE_EQ(p.model_steps, 30);  // the model is measured in shadow
    predictor_->Feedback(p, 30);
  }
  const Prediction p = predictor_->Predict(Req(100));
  EXPECT_TRUE(p.from_model);
  EXPECT_DOUBLE_EQ(p.steps, 30);
  EXPECT_EQ(Metric("tailserve_router_predictions_total{source=\"rule\"}"), 10);
}

TEST_F(LengthPredictorTest, CalibrationCorrectsASystematicBias) {
  config_.warmup_steps = 0;
  config_.drift_mape_threshold = 0.5;  // a 33% error is bias to correct here, not drift
  Start(std::make_unique<ConstantModel>(40));
  for (int i = 0; i < 50; ++i) predictor_->Feedback(predictor_->Predict(Req(100)), 60);  // model 1.5x low
  EXPECT_DOUBLE_EQ(predictor_->Predict(Req(100)).steps, 40);  // not before the update interval
  Tick();
  EXPECT_DOUBLE_EQ(predictor_->Predict(Req(100)).steps, 60);
}

TEST_F(LengthPredictorTest, DriftFlipsToRuleAndFifoAndBack) {
  config_.warmup_steps = 0;
  Start(std::make_unique<ConstantModel>(20));
  // A flood the model gets badly wrong (actual 10x its prediction; calibration adapts per bucket,
  // so vary the truth to keep the error high).
  for (int i = 0; i < 40; ++i) predictor_->Feedback(predictor_->Predict(Req(10)), i % 2 ? 200 : 5);
  Tick();
  ASSERT_TRUE(predictor_->drift_active());
  EXPECT_EQ(Metric("tailserve_router_predictor_drift_active"), 1);
  EXPECT_EQ(Metric("tailserve_router_predictor_drift_events_total"), 1);
  EXPECT_FALSE(predictor_->Predict(Req(10)).from_model);  // the rule serves during drift

  // Predictions become good again; drift stays on for the cool-down, then turns off once the
  // window has forgotten the bad stretch.
  for (int t = 0; t < 30; ++t) {
    for (int i = 0; i < 5; ++i) {
      const Prediction p = predictor_->Predict(Req(10));
      predictor_->Feedback(p, static_cast<int64_t>(p.model_steps));
    }
    Tick();
    if (clock_.Now() - SteadyTime{} < std::chrono::hours(1) + std::chrono::seconds(120)) {
      EXPECT_TRUE(predictor_->drift_active()) << "cool-down not over at tick " << t;
    }
  }
  // 30 ticks of 1 s are not enough for a 120 s cool-down: keep going.
  for (int t = 0; t < 200 && predictor_->drift_active(); ++t) {
    const Prediction p = predictor_->Predict(Req(10));
    predictor_->Feedback(p, static_cast<int64_t>(p.model_steps));
    Tick();
  }
  EXPECT_FALSE(predictor_->drift_active());
  EXPECT_EQ(Metric("tailserve_router_predictor_drift_active"), 0);
  EXPECT_TRUE(predictor_->Predict(Req(10)).from_model);
  EXPECT_LT(predictor_->window_mape(), 0.3);
}

TEST_F(LengthPredictorTest, StepBudget) {
  PredictorConfig c;
  c.step_budget_margin = 0.2;
  c.min_step_budget = 16;
  EXPECT_EQ(InitialStepBudget(c, 100), 120);
  EXPECT_EQ(InitialStepBudget(c, 3), 16);
  c.step_budget_margin = -1;
  EXPECT_EQ(InitialStepBudget(c, 100), 0);
}

}  // namespace
}  // namespace tailserve
