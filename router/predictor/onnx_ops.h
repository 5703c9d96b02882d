#pragma once
// The operators the evaluator runs, one function per op type. Each checks its inputs and
// attributes and returns INVALID_ARGUMENT naming the op when they do not fit.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "absl/status/status.h"
#include "router/predictor/tensor.h"

namespace tailserve {

// Inputs may contain nullptr for omitted optional inputs (empty names).
using OpFn = std::function<absl::Status(const onnx::NodeProto& node, const std::vector<const Tensor*>& in,
                                        std::vector<Tensor>* out)>;

// Keyed by "domain/op_type" ("" is the default domain, "ai.onnx.ml" the ML one).
const std::map<std::string, OpFn>& SupportedOps();
std::string OpKey(const onnx::NodeProto& node);

// Numpy-style broadcast of two shapes; error when they are incompatible.
absl::Status BroadcastShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b, std::vector<int64_t>* out);

}  // namespace tailserve
