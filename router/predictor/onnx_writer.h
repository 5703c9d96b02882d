#pragma once
// Builds length-predictor ONNX graphs with libonnx's protobuf types, as the trainer writes them.
// Both map features [1, n] to "steps" [1, 1] = exp(f(features)) - 1 (the model fits ln(1 + steps)).
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace tailserve {

// f(x) = x . w + b
onnx::ModelProto LinearLengthModel(const std::vector<float>& w, float b, const std::string& doc);

// f(x) = relu(x W1 + b1) . w2 + b2, with W1 row-major [n, hidden].
onnx::ModelProto MlpLengthModel(const std::vector<float>& w1, const std::vector<float>& b1, const std::vector<float>& w2,
                                float b2, int n_features, const std::string& doc);

}  // namespace tailserve
