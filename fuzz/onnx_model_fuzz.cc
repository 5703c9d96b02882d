// An ONNX model's bytes through the length predictor's loader and, when it loads, one evaluation.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "router/predictor/features.h"
#include "router/predictor/onnx_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onnx::ModelProto proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<std::unique_ptr<tailserve::OnnxModel>> model =
      tailserve::OnnxModel::FromProto(std::move(proto), tailserve::kFeatureInputName, tailserve::kNumFeatures, "fuzz.onnx");
  if (!model.ok()) return 0;
  const std::vector<float> features(tailserve::kNumFeatures, 1.5f);
  (void)(*model)->Predict(features);
  return 0;
}
