#pragma once
// Fits the length predictor (decode steps from the request features) and exports it as ONNX.
// Data: the router's feedback log (JSON lines: {"features": {name: value, ...}, "actual_steps": n})
// or a trace (prompt and output lengths; features the trace lacks come from `defaults`).
#include <functional>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "absl/status/statusor.h"
#include "router/predictor/features.h"

namespace tailserve {

struct Sample {
  FeatureVector x{};
  double steps = 0;
};

absl::StatusOr<std::vector<Sample>> ReadFeedbackLog(const std::string& path);
absl::StatusOr<std::vector<Sample>> ReadTrace(const std::string& path, const FeatureInput& defaults, size_t limit);

using Predictor = std::function<double(const FeatureVector&)>;

struct Fit {
  onnx::ModelProto model;  // what the ONNX file holds
  Predictor predict;       // the same function, computed here
};

// Ridge regression of ln(1 + steps) on standardized features (constant features get weight 0).
Fit FitLinear(const std::vector<Sample>& samples, double ridge);
// One hidden ReLU layer of `hidden` units, full-batch Adam on the same target.
Fit FitMlp(const std::vector<Sample>& samples, int hidden, int epochs, uint64_t seed);

struct Evaluation {
  double mape = 0;         // mean |pred - actual| / actual
  double mae = 0;          // mean |pred - actual| in steps
  double within_20 = 0;    // share of predictions within +-20% of the actual
  // Spearman's rank correlation of predicted and actual: how well the predictions order requests
  // (what shortest-first admission and preemption use); 0 when either side is constant.
  double rank_corr = 0;
};
Evaluation Evaluate(const Predictor& p, const std::vector<Sample>& samples);
// Spearman's rho (ties get their mean rank); 0 for fewer than two values or a constant side.
double RankCorrelation(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace tailserve
