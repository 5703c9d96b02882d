// An HTTP API request body (JSON) through the router's translation, for both routes, rendering
// chat messages through the default model's chat template; then the request path's validation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/tokenizer.h"
#include "router/http/openai_api.h"
#include "router/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tailserve;
  static const jinja::Template* tmpl = [] {
    // A template with the constructs real ones use: loops, conditionals, filters, tool calls.
    auto t = jinja::Template::Parse(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}<<SYS>>{{ m.content | trim }}"
        "{% elif m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }})"
        "{% endfor %}{% else %}[{{ m.role | upper }}] {{ m.content }}{% endif %}{% endfor %}"
        "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}");
    return new jinja::Template(*std::move(t));
  }();
  static const http::ModelInfo model = [] {
    http::ModelInfo m;
    m.name = "m";
    m.chat_template = tmpl;
    m.special_tokens = {{"bos_token", "<s>"}};
    m.now_unix = 0;
    return m;
  }();
  static const ByteTokenizer tokenizer;
  static const RouterConfig limits;
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    http::ApiError error;
    absl::StatusOr<http::ApiRequest> r = http::ParseRequest(body, chat, model, &error);
    if (!r.ok()) {
      (void)error.Json();
      continue;
    }
    (void)ValidateRequest(r->generate, limits, tokenizer);
  }
  return 0;
}
