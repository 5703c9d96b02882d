#pragma once
// The checks of SamplingParams that the router (at the edge) and the worker (whoever reached its
// port) both make: INVALID_ARGUMENT naming the field.
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tailserve/v1/common.pb.h"

namespace tailserve {

inline constexpr int32_t kMaxTopLogprobsRequest = 20;

inline absl::Status CheckSamplingParams(const v1::SamplingParams& s) {
  if (!std::isfinite(s.temperature()) || s.temperature() < 0 || s.temperature() > 100) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.temperature: must be in [0, 100], got ", s.temperature()));
  }
  if (!std::isfinite(s.top_p()) || s.top_p() < 0 || s.top_p() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.top_p: must be in [0, 1] (0 means 1), got ", s.top_p()));
  }
  if (s.top_k() < 0) return absl::InvalidArgumentError(absl::StrCat("sampling.top_k: must be >= 0, got ", s.top_k()));
  if (s.top_logprobs() < 0 || s.top_logprobs() > kMaxTopLogprobsRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_logprobs: must be in [0, ", kMaxTopLogprobsRequest, "], got ", s.top_logprobs()));
  }
  if (s.top_logprobs() > 0 && !s.logprobs()) {
    return absl::InvalidArgumentError("sampling.top_logprobs: needs sampling.logprobs");
  }
  return absl::OkStatus();
}

}  // namespace tailserve
