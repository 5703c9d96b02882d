#pragma once
// The OpenAI HTTP API's JSON, translated to and from tailserve's request path (no I/O here, so it
// is tested without a server): a /v1/completions or /v1/chat/completions body becomes a
// v1::GenerateRequest (chat messages rendered through the model's own chat template), which the
// router validates as it validates gRPC requests; responses, stream chunks and errors take
// OpenAI's shapes. tailserve's own fields (priority, ttft_slo_ms, tpot_slo_ms, session_id, top_k)
// are accepted as documented extensions (docs/http-api.md).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "common/jinja/template.h"
#include "common/tokenizer.h"
#include "tailserve/v1/generation.pb.h"

namespace tailserve::http {

// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  double retry_after_s = 0;  // > 0: the Retry-After header (429)

  static ApiError Make(int status, std::string message, std::string type = "invalid_request_error",
                       std::string param = "", std::string code = "") {
    ApiError e;
    e.status = status, e.message = std::move(message), e.type = std::move(type);
    e.param = std::move(param), e.code = std::move(code);
    return e;
  }
  std::string Json() const;
};
// A status from the request path as the API's error: INVALID_ARGUMENT 400 (param from the message's
// "field: ..." prefix, in OpenAI's names), NOT_FOUND 404, UNAUTHENTICATED 401, RESOURCE_EXHAUSTED
// 429 (Retry-After from the router's "retry after N s" hint), UNAVAILABLE 503, DEADLINE_EXCEEDED
// 504, the rest 500.
ApiError ErrorFromStatus(const absl::Status& status);

// What a request needs from the served model.
struct ModelInfo {
  std::string name;                              // what "model" must say
  const jinja::Template* chat_template = nullptr;  // null: chat completions are refused, saying
  std::string chat_template_error;                 // why (no template, or why it did not load)
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();  // bos_token, eos_token, ...
  int32_t max_tokens_limit = 4096;               // chat's default max_tokens
  std::optional<int64_t> now_unix;               // strftime_now's clock (tests)
};

struct ApiRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // the response carries each token's log-probabilities
  std::string model;
  v1::GenerateRequest generate;
};

// Deepest nesting of arrays and objects a body may have (tools' JSON schemas need a dozen or so).
inline constexpr int kMaxJsonDepth = 64;

// Parses and translates a request body. Field-level problems are 400s naming the field; a model
// other than the served one is 404 (code model_not_found).
absl::StatusOr<ApiRequest> ParseRequest(const std::string& body, bool chat, const ModelInfo& model,
                                        ApiError* error);

// The OpenAI finish_reason of a tailserve one ("stop", "length"; null while running).
nlohmann::ordered_json FinishReason(v1::FinishReason r);
nlohmann::ordered_json UsageJson(const v1::Usage& usage);

// The choice's "logprobs" in OpenAI's shape, built from the responses' tokens as they come: chat's
// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}, completions'
// {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}. A token's text is its
// bytes (a piece of a UTF-8 character shows as U+FFFD; `bytes` has it exactly), special tokens
// by their names.
class LogprobsBuilder {
 public:
  LogprobsBuilder(bool chat, const Tokenizer& tokenizer) : chat_(chat), tokenizer_(&tokenizer) {}
  void Add(const v1::GenerateResponse& r);
  bool pending() const { return !entries_.empty(); }
  // What was added since the last Take (a stream's chunk, or the whole response), in the API's shape.
  nlohmann::ordered_json Take();

 private:
  bool chat_;
  const Tokenizer* tokenizer_;
  std::vector<std::pair<int32_t, v1::TokenLogprob>> entries_;
  int64_t text_offset_ = 0;  // completions: where the next token's text starts, in characters
};

// A whole (non-streamed) response; `logprobs` null when not asked.
std::string CompletionJson(const ApiRequest& req, const std::string& id, int64_t created, const std::string& text,
                           v1::FinishReason finish, const v1::Usage& usage,
                           const nlohmann::ordered_json& logprobs = nullptr);
// One server-sent event of a stream ("data: {...}\n\n"): a text delta (chat's first carries the
// role) with its tokens' logprobs when asked, the last with its finish_reason, and with
// include_usage a final one with only usage.
std::string ChunkEvent(const ApiRequest& req, const std::string& id, int64_t created, const std::string& delta,
                       bool first, std::optional<v1::FinishReason> finish,
                       const nlohmann::ordered_json& logprobs = nullptr);
std::string UsageEvent(const ApiRequest& req, const std::string& id, int64_t created, const v1::Usage& usage);
inline constexpr const char* kDoneEvent = "data: [DONE]\n\n";

}  // namespace tailserve::http
