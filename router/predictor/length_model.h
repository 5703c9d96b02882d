#pragma once
// A model that maps a request's feature vector to predicted decode steps. The in-process ONNX
// evaluator implements it; ONNX Runtime could too.
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace tailserve {

class LengthModel {
 public:
  virtual ~LengthModel() = default;
  // Features in the order of FeatureNames(); returns predicted decode steps (not yet clamped).
  virtual absl::StatusOr<float> Predict(std::span<const float> features) const = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace tailserve
