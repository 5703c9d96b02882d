#pragma once
// A chat template, parsed once (per model) and rendered per request, byte for byte as transformers'
// apply_chat_template renders it with Python's jinja2 (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, its tojson, raise_exception and strftime_now): docs/chat-templates.md.
//
//   auto t = jinja::Template::Parse(source);            // INVALID_ARGUMENT naming the line
//   auto text = t->Render({{"messages", ...}, {"add_generation_prompt", true}, ...});
//
// A render error (raise_exception, a type error, an unknown filter, attribute access on an
// undefined value) is INVALID_ARGUMENT with the message and line; nothing partial is returned.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/jinja/ast.h"

namespace tailserve::jinja {

struct RenderOptions {
  // strftime_now's clock (seconds since the epoch, local time = UTC); unset: the system clock.
  std::optional<int64_t> now_unix;
  // The render budget: statements run and loop iterations (far beyond a real chat template; a
  // long conversation takes thousands). Past it, or past 16 MiB of output or of one value, the
  // render fails rather than loop or grow without bound.
  int64_t max_steps = 1'000'000;
};

class Template {
 public:
  static absl::StatusOr<Template> Parse(std::string_view source);
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace tailserve::jinja
