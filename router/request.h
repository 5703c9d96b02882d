#pragma once
// A client request after validation: typed, tokenized, ready for the core.
#include <cstdint>
#include <string>
#include <vector>

#include "tailserve/v1/generation.pb.h"

namespace tailserve {

struct ParsedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  v1::SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  v1::Priority priority = v1::PRIORITY_STANDARD;
  // As sent (0: the class default, which the core fills in from router.slo).
  int32_t ttft_slo_ms = 0;
  int32_t tpot_slo_ms = 0;
  // The client's conversation id (empty: none), an affinity hint for placement.
  std::string session_id;
  // Share of non-alphanumeric characters in the prompt text (a predictor feature).
  double non_alnum_ratio = 0;
};

}  // namespace tailserve
