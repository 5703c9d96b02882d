#pragma once
// Edge validation of GenerateRequest: every rejection is INVALID_ARGUMENT naming the field.
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/tokenizer.h"
#include "router/request.h"
#include "tailserve/v1/generation.pb.h"

namespace tailserve {

inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr int kMaxStopTokenIds = 64;

absl::StatusOr<ParsedRequest> ValidateRequest(const v1::GenerateRequest& req, const RouterConfig& limits,
                                              const Tokenizer& tokenizer);

}  // namespace tailserve
