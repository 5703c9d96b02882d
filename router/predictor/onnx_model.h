#pragma once
// A length-predictor ONNX model, loaded with libonnx (parse, checker, shape inference) and run by
// a small, strict in-process evaluator (router/predictor/onnx_ops.h lists the operators). Anything
// it cannot run is refused at load with the node and op named, never at request time.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "absl/status/statusor.h"
#include "router/predictor/length_model.h"
#include "router/predictor/tensor.h"

namespace tailserve {

class OnnxModel final : public LengthModel {
 public:
  // The graph must take one float input named `input_name` shaped [1, n_features] (the batch
  // dimension may be symbolic) or [n_features], and produce one float output whose first element
  // is the prediction.
  static absl::StatusOr<std::unique_ptr<OnnxModel>> Load(const std::string& path, const std::string& input_name,
                                                         int n_features);
  static absl::StatusOr<std::unique_ptr<OnnxModel>> FromProto(onnx::ModelProto model, const std::string& input_name,
                                                              int n_features, const std::string& source);

  absl::StatusOr<float> Predict(std::span<const float> features) const override;
  std::string Describe() const override { return description_; }

  // Runs the graph on named inputs; returns the graph outputs in order.
  absl::StatusOr<std::vector<Tensor>> Run(const std::map<std::string, Tensor>& inputs) const;

 private:
  OnnxModel() = default;
  onnx::ModelProto model_;
  std::map<std::string, Tensor> initializers_;
  std::string input_name_;
  int n_features_ = 0;
  bool input_is_vector_ = false;
  std::string description_;
};

// Converts an initializer (float or int64; raw or typed storage).
absl::StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& t);

}  // namespace tailserve
