// A hostile chat template and context: the input is template source, a NUL byte, then the JSON
// context (messages, tools, ...). Parse errors and render errors are fine; crashes, hangs and
// unbounded allocation are not.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t split = in.find('\0');
  const std::string_view source = in.substr(0, split);
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (split != std::string_view::npos) {
    context = nlohmann::ordered_json::parse(in.substr(split + 1), nullptr, /*allow_exceptions=*/false);
    if (context.is_discarded() || !context.is_object()) context = nlohmann::ordered_json::object();
  }
  absl::StatusOr<tailserve::jinja::Template> t = tailserve::jinja::Template::Parse(source);
  // A smaller step budget than the server's, so runaway loops end in milliseconds and the fuzzer
  // keeps its pace; the budget's logic is the same.
  if (t.ok()) (void)t->Render(context, {.now_unix = 0, .max_steps = 20'000});
  return 0;
}
