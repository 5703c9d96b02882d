#pragma once
// The cases of a reference checkpoint (../shared/reference/<model>/expected.json) and the logits
// transformers computed for them, as the CPU and CUDA backend tests read them.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model/safetensors.h"

namespace tailserve::testing {

// ‖a − b‖ / ‖b‖ over n floats, in double.
inline double RelL2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

struct ReferenceCase {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> margin;  // top-1 minus top-2 logit at every position of prompt + greedy
  std::string logits_tensor;

  // Prompt then greedy continuation: what the logits tensor was computed over.
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), greedy.begin(), greedy.end());
    return all;
  }
};

inline std::vector<ReferenceCase> LoadReferenceCases(const std::string& dir) {
  std::ifstream in(dir + "/expected.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<ReferenceCase> cases;
  for (const nlohmann::json& c : j["cases"]) {
    cases.push_back({c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy_ids"].get<std::vector<int32_t>>(),
                     c["top1_margin"].get<std::vector<float>>(), c["logits_tensor"].get<std::string>()});
  }
  return cases;
}

// transformers' logits for the case, [tokens, vocab] as float.
inline std::vector<float> ExpectedLogits(const SafetensorsFile& expected, const ReferenceCase& c) {
  const TensorInfo& t = expected.tensors().at(c.logits_tensor);
  std::vector<float> f(static_cast<size_t>(t.numel()));
  ToFloat(t.dtype, t.data, f.size(), f.data());
  return f;
}

}  // namespace tailserve::testing
