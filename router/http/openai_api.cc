#include "router/http/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tailserve::http {
namespace {

using Json = nlohmann::ordered_json;

ApiError Bad(const std::string& param, const std::string& message) {
  return ApiError::Make(400, message, "invalid_request_error", param);
}

// gRPC field names as the API spells them.
std::string ApiParam(const std::string& field) {
  if (absl::StartsWith(field, "sampling.")) return field.substr(9);
  if (absl::StartsWith(field, "prompt_token_ids")) return "prompt";
  return field;
}

// The text of a message's content: a string, null, or an array of {"type": "text", "text"} parts.
absl::StatusOr<Json> FlattenContent(const Json& content, size_t i) {
  if (content.is_string() || content.is_null()) return content;
  if (!content.is_array()) return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].content"));
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].content"));
    }
    text += part["text"].get<std::string>();
  }
  return Json(text);
}

// The deepest nesting of arrays and objects, walked without recursion: the chat template's
// values, tojson and repr recurse over whatever a client sends.
int Depth(const Json& root) {
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> todo = {{&root, 1}};
  while (!todo.empty()) {
    auto [j, d] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    deepest = std::max(deepest, d);
    for (const Json& child : *j) todo.emplace_back(&child, d + 1);
  }
  return deepest;
}

}  // namespace

std::string ApiError::Json() const {
  nlohmann::ordered_json e = {{"message", message},
                              {"type", type},
                              {"param", param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(param)},
                              {"code", code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(code)}};
  return nlohmann::ordered_json{{"error", e}}.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ApiError ErrorFromStatus(const absl::Status& status) {
  const std::string msg(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: {
      const size_t colon = msg.find(": ");
      const std::string field = colon == std::string::npos ? "" : msg.substr(0, colon);
      const bool named = !field.empty() && field.find(' ') == std::string::npos;
      return Bad(named ? ApiParam(field) : "", named ? ApiParam(field) + msg.substr(colon) : msg);
    }
    case absl::StatusCode::kNotFound: return ApiError::Make(404, msg, "invalid_request_error", "", "model_not_found");
    case absl::StatusCode::kUnauthenticated:
      return ApiError::Make(401, msg, "authentication_error", "", "invalid_api_key");
    case absl::StatusCode::kResourceExhausted: {
      double retry = 1;
      if (const size_t at = msg.find("retry after "); at != std::string::npos) retry = std::atof(msg.c_str() + at + 12);
      ApiError e = ApiError::Make(429, msg, "rate_limit_error");
      e.retry_after_s = std::max(retry, 0.001);
      return e;
    }
    case absl::StatusCode::kUnavailable: return ApiError::Make(503, msg, "server_error");
    case absl::StatusCode::kDeadlineExceeded: return ApiError::Make(504, msg, "server_error");
    default: return ApiError::Make(500, msg, "server_error");
  }
}

absl::StatusOr<ApiRequest> ParseRequest(const std::string& body, bool chat, const ModelInfo& model, ApiError* error) {
  auto fail = [&](ApiError e) -> absl::Status {
    *error = std::move(e);
    return absl::InvalidArgumentError(error->message);
  };
  Json j;
  try {
    j = Json::parse(body);
  } catch (const std::exception& e) {
    return fail(Bad("", absl::StrCat("the body is not valid JSON: ", e.what())));
  }
  if (!j.is_object()) return fail(Bad("", "the body must be a JSON object"));
  if (Depth(j) > kMaxJsonDepth) {
    return fail(Bad("", absl::StrCat("the body nests arrays and objects deeper than ", kMaxJsonDepth, " levels")));
  }
  ApiRequest r;
  r.chat = chat;
  v1::GenerateRequest& g = r.generate;
  try {
    if (!j.contains("model") || !j["model"].is_string()) return fail(Bad("model", "model: a string is required"));
    r.model = j["model"].get<std::string>();
    if (r.model != model.name) {
      return fail(ApiError::Make(404, absl::StrCat("The model '", r.model, "' does not exist; this server serves '", model.name, "'"),
                                 "invalid_request_error", "model", "model_not_found"));
    }
    auto number = [&](const char* key, double lo, double hi, double* out) -> absl::Status {
      if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
      if (!j[key].is_number()) return fail(Bad(key, absl::StrCat(key, ": must be a number")));
      const double v = j[key].get<double>();
      if (!(v >= lo && v <= hi)) return fail(Bad(key, absl::StrCat(key, ": must be in [", lo, ", ", hi, "], got ", v)));
      *out = v;
      return absl::OkStatus();
    };
    auto integer = [&](const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) -> absl::Status {
      if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
      if (!j[key].is_number_integer()) return fail(Bad(key, absl::StrCat(key, ": must be an integer")));
      const int64_t v = j[key].get<int64_t>();
      if (v < lo || v > hi) return fail(Bad(key, absl::StrCat(key, ": must be in [", lo, ", ", hi, "], got ", v)));
      *out = v;
      return absl::OkStatus();
    };
    if (j.contains("stream") && !j["stream"].is_null()) {
      if (!j["stream"].is_boolean()) return fail(Bad("stream", "stream: must be a boolean"));
      r.stream = j["stream"].get<bool>();
    }
    if (j.contains("stream_options") && j["stream_options"].is_object()) {
      r.include_usage = j["stream_options"].value("include_usage", false);
    }
    std::optional<int64_t> n, max_tokens, max_completion, seed, top_k, ttft, tpot, logprobs_n;
    for (absl::Status s : {integer("n", 1, 128, &n), integer("max_tokens", 1, INT32_MAX, &max_tokens),
                           integer("max_completion_tokens", 1, INT32_MAX, &max_completion),
                           integer("seed", INT64_MIN, INT64_MAX, &seed), integer("top_k", -1, INT32_MAX, &top_k),
                           integer("ttft_slo_ms", 0, INT32_MAX, &ttft), integer("tpot_slo_ms", 0, INT32_MAX, &tpot),
                           chat ? integer("top_logprobs", 0, 20, &logprobs_n) : absl::OkStatus()}) {
      if (!s.ok()) return s;
    }
    if (n && *n != 1) return fail(Bad("n", "n: only 1 choice per request is supported"));
    // logprobs: chat's is a boolean with top_logprobs beside it; completions' is the number of
    // alternatives (OpenAI allows 5; as vLLM, up to 20).
    if (j.contains("logprobs") && !j["logprobs"].is_null()) {
      const Json& lp = j["logprobs"];
      if (chat) {
        if (!lp.is_boolean()) return fail(Bad("logprobs", "logprobs: must be a boolean"));
        r.logprobs = lp.get<bool>();
      } else {
        std::optional<int64_t> count;
        if (absl::Status s = integer("logprobs", 0, 20, &count); !s.ok()) return s;
        r.logprobs = true;
        logprobs_n = count;
      }
    }
    if (chat && logprobs_n.value_or(0) > 0 && !r.logprobs) {
      return fail(Bad("top_logprobs", "top_logprobs: needs logprobs set to true"));
    }
    if (r.logprobs) {
      g.mutable_sampling()->set_logprobs(true);
      g.mutable_sampling()->set_top_logprobs(static_cast<int32_t>(logprobs_n.value_or(0)));
    }
    for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
      if (j.contains(penalty) && j[penalty].is_number() && j[penalty].get<double>() != 0) {
        return fail(Bad(penalty, absl::StrCat(penalty, ": not supported yet (only 0)")));
      }
    }
    double temperature = 1.0, top_p = 1.0;
    if (absl::Status s = number("temperature", 0, 2, &temperature); !s.ok()) return s;
    if (absl::Status s = number("top_p", 0, 1, &top_p); !s.ok()) return s;
    g.mutable_sampling()->set_temperature(static_cast<float>(temperature));
    g.mutable_sampling()->set_top_p(static_cast<float>(top_p));
    if (top_k && *top_k > 0) g.mutable_sampling()->set_top_k(static_cast<int32_t>(*top_k));
    if (seed) g.mutable_sampling()->set_seed(static_cast<uint64_t>(*seed));
    if (max_completion) max_tokens = max_completion;
    g.set_max_tokens(static_cast<int32_t>(max_tokens.value_or(chat ? model.max_tokens_limit : 16)));
    if (j.contains("stop") && !j["stop"].is_null()) {
      const Json& stop = j["stop"];
      if (stop.is_string()) {
        g.add_stop(stop.get<std::string>());
      } else if (stop.is_array()) {
        for (const Json& s : stop) {
          if (!s.is_string()) return fail(Bad("stop", "stop: must be a string or an array of strings"));
          g.add_stop(s.get<std::string>());
        }
      } else {
        return fail(Bad("stop", "stop: must be a string or an array of strings"));
      }
    }
    if (j.contains("priority") && !j["priority"].is_null()) {
      const std::string p = j["priority"].is_string() ? j["priority"].get<std::string>() : "";
      if (p == "interactive") g.set_priority(v1::PRIORITY_INTERACTIVE);
      else if (p == "standard") g.set_priority(v1::PRIORITY_STANDARD);
      else if (p == "batch") g.set_priority(v1::PRIORITY_BATCH);
      else return fail(Bad("priority", "priority: one of interactive, standard, batch"));
    }
    if (ttft) g.set_ttft_slo_ms(static_cast<int32_t>(*ttft));
    if (tpot) g.set_tpot_slo_ms(static_cast<int32_t>(*tpot));
    if (j.contains("session_id") && j["session_id"].is_string()) g.set_session_id(j["session_id"].get<std::string>());
    if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string()) return fail(Bad("user", "user: must be a string"));

    if (!chat) {
      if (!j.contains("prompt")) return fail(Bad("prompt", "prompt: required"));
      const Json& p = j["prompt"];
      if (p.is_string()) {
        g.set_prompt(p.get<std::string>());
      } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        g.set_prompt(p[0].get<std::string>());
      } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
        for (const Json& t : p) {
          if (!t.is_number_integer()) return fail(Bad("prompt", "prompt: token ids must be integers"));
          const int64_t id = t.get<int64_t>();
          if (id < INT32_MIN || id > INT32_MAX) return fail(Bad("prompt", absl::StrCat("prompt: token id ", id, " out of range")));
          g.add_prompt_token_ids(static_cast<int32_t>(id));
        }
      } else if (p.is_array() && p.size() > 1) {
        return fail(Bad("prompt", "prompt: one prompt per request is supported"));
      } else {
        return fail(Bad("prompt", "prompt: a string, an array of token ids, or an array of one string"));
      }
      return r;
    }
    if (model.chat_template == nullptr) {
      return fail(Bad("messages", absl::StrCat("messages: ", model.chat_template_error.empty()
                                                                 ? "the served model has no chat template; use /v1/completions"
                                                                 : model.chat_template_error)));
    }
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
      return fail(Bad("messages", "messages: a non-empty array is required"));
    }
    Json messages = Json::array();
    for (size_t i = 0; i < j["messages"].size(); ++i) {
      Json m = j["messages"][i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return fail(Bad(absl::StrCat("messages[", i, "].role"), absl::StrCat("messages[", i, "].role: a string is required")));
      }
      if (m.contains("content")) {
        absl::StatusOr<Json> content = FlattenContent(m["content"], i);
        if (!content.ok()) {
          return fail(Bad(std::string(content.status().message()),
                          absl::StrCat(content.status().message(), ": a string, null, or an array of text parts")));
        }
        m["content"] = *std::move(content);
      }
      messages.push_back(std::move(m));
    }
    Json context = model.special_tokens;
    context["messages"] = std::move(messages);
    context["tools"] = j.contains("tools") && j["tools"].is_array() ? j["tools"] : Json();
    context["documents"] = Json();
    context["add_generation_prompt"] = j.value("add_generation_prompt", true);
    if (j.contains("chat_template_kwargs") && j["chat_template_kwargs"].is_object()) {
      for (const auto& [k, v] : j["chat_template_kwargs"].items()) context[k] = v;
    }
    absl::StatusOr<std::string> prompt = model.chat_template->Render(context, {.now_unix = model.now_unix});
    if (!prompt.ok()) return fail(Bad("messages", absl::StrCat("messages: ", prompt.status().message())));
    g.set_prompt(*std::move(prompt));
    return r;
  } catch (const std::exception& e) {
    return fail(Bad("", absl::StrCat("malformed request: ", e.what())));
  }
}

nlohmann::ordered_json FinishReason(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_CANCELLED: return "abort";
    case v1::FINISH_REASON_ERROR: return "error";
    default: return nullptr;
  }
}

nlohmann::ordered_json UsageJson(const v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens()}}}};
}

namespace {

Json Envelope(const ApiRequest& req, const std::string& id, int64_t created, bool chunk) {
  return {{"id", id},
          {"object", req.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", created},
          {"model", req.model}};
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

void LogprobsBuilder::Add(const v1::GenerateResponse& r) {
  for (int i = 0; i < r.token_ids_size() && i < r.logprobs_size(); ++i) entries_.emplace_back(r.token_ids(i), r.logprobs(i));
}

Json LogprobsBuilder::Take() {
  auto bytes = [](const std::string& text) {
    Json b = Json::array();
    for (const unsigned char c : text) b.push_back(static_cast<int>(c));
    return b;
  };
  Json out;
  if (chat_) {
    Json content = Json::array();
    for (const auto& [id, lp] : entries_) {
      const std::string text = tokenizer_->TokenText(id);
      Json top = Json::array();
      for (int k = 0; k < lp.top_token_ids_size() && k < lp.top_logprobs_size(); ++k) {
        const std::string alt = tokenizer_->TokenText(lp.top_token_ids(k));
        top.push_back({{"token", alt}, {"logprob", lp.top_logprobs(k)}, {"bytes", bytes(alt)}});
      }
      content.push_back({{"token", text}, {"logprob", lp.logprob()}, {"bytes", bytes(text)}, {"top_logprobs", top}});
    }
    out = {{"content", content}, {"refusal", nullptr}};
  } else {
    Json tokens = Json::array(), values = Json::array(), tops = Json::array(), offsets = Json::array();
    for (const auto& [id, lp] : entries_) {
      const std::string text = tokenizer_->TokenText(id);
      tokens.push_back(text);
      values.push_back(lp.logprob());
      Json top = Json::object();
      for (int k = 0; k < lp.top_token_ids_size() && k < lp.top_logprobs_size(); ++k) {
        top[tokenizer_->TokenText(lp.top_token_ids(k))] = lp.top_logprobs(k);
      }
      tops.push_back(top);
      offsets.push_back(text_offset_);
      for (const unsigned char c : text) text_offset_ += (c & 0xC0) != 0x80;  // characters, as OpenAI counts
    }
    out = {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }
  entries_.clear();
  return out;
}

std::string CompletionJson(const ApiRequest& req, const std::string& id, int64_t created, const std::string& text,
                           v1::FinishReason finish, const v1::Usage& usage, const Json& logprobs) {
  Json j = Envelope(req, id, created, false);
  Json choice = {{"index", 0}};
  if (req.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = FinishReason(finish);
  j["choices"] = Json::array({choice});
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string ChunkEvent(const ApiRequest& req, const std::string& id, int64_t created, const std::string& delta,
                       bool first, std::optional<v1::FinishReason> finish, const Json& logprobs) {
  Json j = Envelope(req, id, created, true);
  Json choice = {{"index", 0}};
  if (req.chat) {
    Json d = Json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || (first && !finish)) d["content"] = delta;
    choice["delta"] = d;
  } else {
    choice["text"] = delta;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish ? FinishReason(*finish) : Json();
  j["choices"] = Json::array({choice});
  if (req.include_usage) j["usage"] = nullptr;
  return "data: " + Dump(j) + "\n\n";
}

std::string UsageEvent(const ApiRequest& req, const std::string& id, int64_t created, const v1::Usage& usage) {
  Json j = Envelope(req, id, created, true);
  j["choices"] = Json::array();
  j["usage"] = UsageJson(usage);
  return "data: " + Dump(j) + "\n\n";
}

}  // namespace tailserve::http
