#pragma once
// The length predictor's input: a named float vector, in this order. The ONNX model's input
// "features" is shaped [1, kNumFeatures]; the trainer and the router's feedback log use the names.
//
//   prompt_tokens      prompt length in tokens
//   log_prompt_tokens  ln(1 + prompt_tokens)
//   non_alnum_ratio    share of non-alphanumeric characters among the prompt's non-space
//                      characters (punctuation, symbols, emoji); 0 for an empty text
//   max_tokens         the request's cap on new tokens
//   log_max_tokens     ln(1 + max_tokens)
//   priority           1 interactive, 2 standard, 3 batch
//   has_stop           1 when stop strings or stop token ids are set
//   temperature        sampling temperature (0 = greedy)
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tailserve {

inline constexpr int kNumFeatures = 8;
inline constexpr std::array<const char*, kNumFeatures> kFeatureNames = {
    "prompt_tokens", "log_prompt_tokens", "non_alnum_ratio", "max_tokens",
    "log_max_tokens", "priority", "has_stop", "temperature"};
inline constexpr const char* kFeatureInputName = "features";

struct FeatureInput {
  int64_t prompt_tokens = 0;
  double non_alnum_ratio = 0;
  int32_t max_tokens = 0;
  int priority = 2;
  bool has_stop = false;
  float temperature = 0;
};

using FeatureVector = std::array<float, kNumFeatures>;
FeatureVector MakeFeatures(const FeatureInput& in);

// Over UTF-8 text: ASCII letters and digits and non-ASCII letters of other scripts count as
// alphanumeric; ASCII punctuation, symbols, emoji and other pictographs do not; whitespace is
// ignored. Invalid UTF-8 bytes count as non-alphanumeric.
double NonAlnumRatio(std::string_view text);

}  // namespace tailserve
