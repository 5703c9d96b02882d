#include "router/validate.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/sampling_checks.h"
#include "router/predictor/features.h"

namespace tailserve {
namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

absl::StatusOr<ParsedRequest> ValidateRequest(const v1::GenerateRequest& req, const RouterConfig& limits,
                                              const Tokenizer& tokenizer) {
  ParsedRequest out;
  if (req.request_id().size() > kMaxRequestIdBytes) {
    return Invalid("request_id", absl::StrCat("longer than ", kMaxRequestIdBytes, " bytes"));
  }
  out.request_id = req.request_id();
  if (req.session_id().size() > kMaxRequestIdBytes) {
    return Invalid("session_id", absl::StrCat("longer than ", kMaxRequestIdBytes, " bytes"));
  }
  out.session_id = req.session_id();

  const bool has_text = !req.prompt().empty();
  const bool has_ids = !req.prompt_token_ids().empty();
  if (has_text && has_ids) return Invalid("prompt", "set either prompt or prompt_token_ids, not both");
  if (!has_text && !has_ids) return Invalid("prompt", "must not be empty");
  if (has_text) {
    // Cheap bound before tokenizing: no tokenizer makes fewer than one token per 64 bytes.
    if (req.prompt().size() > static_cast<size_t>(limits.max_prompt_tokens) * 64) {
      return Invalid("prompt", absl::StrCat(req.prompt().size(), " bytes is too long"));
    }
    out.prompt = tokenizer.EncodePrompt(req.prompt());
    out.non_alnum_ratio = NonAlnumRatio(req.prompt());
  } else {
    const int32_t vocab = tokenizer.vocab_size();
    for (int i = 0; i < req.prompt_token_ids_size(); ++i) {
      const int32_t t = req.prompt_token_ids(i);
      if (t < 0 || t >= vocab) {
        return Invalid(absl::StrCat("prompt_token_ids[", i, "]"),
                       absl::StrCat("token id ", t, " outside the vocabulary [0, ", vocab, ")"));
      }
    }
    out.prompt.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
    std::string text;
    for (int32_t t : out.prompt) text += tokenizer.TokenBytes(t);
    out.non_alnum_ratio = NonAlnumRatio(text);
  }
  if (out.prompt.empty()) return Invalid("prompt", "tokenizes to no tokens");
  if (static_cast<int64_t>(out.prompt.size()) > limits.max_prompt_tokens) {
    return Invalid("prompt", absl::StrCat(out.prompt.size(), " tokens exceeds the limit of ",
                                          limits.max_prompt_tokens));
  }

  if (req.max_tokens() <= 0) return Invalid("max_tokens", absl::StrCat("must be > 0, got ", req.max_tokens()));
  if (req.max_tokens() > limits.max_tokens_limit) {
    return Invalid("max_tokens", absl::StrCat(req.max_tokens(), " exceeds the limit of ", limits.max_tokens_limit));
  }
  out.max_tokens = req.max_tokens();

  const v1::SamplingParams& s = req.sampling();
  TAILSERVE_RETURN_IF_ERROR(CheckSamplingParams(s));
  out.sampling = s;

  if (req.stop_size() > kMaxStopStrings) {
    return Invalid("stop", absl::StrCat(req.stop_size(), " stop strings; at most ", kMaxStopStrings));
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    const std::string& st = req.stop(i);
    if (st.empty() || st.size() > kMaxStopStringBytes) {
      return Invalid(absl::StrCat("stop[", i, "]"), absl::StrCat("must be 1..", kMaxStopStringBytes, " bytes"));
    }
    out.stop.push_back(st);
  }
  if (req.stop_token_ids_size() > kMaxStopTokenIds) {
    return Invalid("stop_token_ids", absl::StrCat("at most ", kMaxStopTokenIds, " ids"));
  }
  for (int i = 0; i < req.stop_token_ids_size(); ++i) {
    const int32_t t = req.stop_token_ids(i);
    if (t < 0 || t >= tokenizer.vocab_size()) {
      return Invalid(absl::StrCat("stop_token_ids[", i, "]"), absl::StrCat("token id ", t, " outside the vocabulary"));
    }
    out.stop_token_ids.push_back(t);
  }

  switch (req.priority()) {
    case v1::PRIORITY_UNSPECIFIED:
    case v1::PRIORITY_STANDARD:
      out.priority = v1::PRIORITY_STANDARD;
      break;
    case v1::PRIORITY_INTERACTIVE:
    case v1::PRIORITY_BATCH:
      out.priority = req.priority();
      break;
    default:
      return Invalid("priority", absl::StrCat("unknown value ", static_cast<int>(req.priority())));
  }
  if (req.ttft_slo_ms() < 0) return Invalid("ttft_slo_ms", absl::StrCat("must be >= 0, got ", req.ttft_slo_ms()));
  if (req.tpot_slo_ms() < 0) return Invalid("tpot_slo_ms", absl::StrCat("must be >= 0, got ", req.tpot_slo_ms()));
  out.ttft_slo_ms = req.ttft_slo_ms();
  out.tpot_slo_ms = req.tpot_slo_ms();
  return out;
}

}  // namespace tailserve
