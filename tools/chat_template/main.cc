// tailserve-chat-template: renders a chat template as the router does (common/jinja), for checking
// a model's template and for the differential tests against Python's jinja2.
//   tailserve-chat-template --template T.jinja --context ctx.json   the text, or the error (exit 1)
//   tailserve-chat-template --batch < cases.jsonl                    one JSON line per case:
//     in {"template": "...", "context": {...}, "now": 1700000000}, out {"ok": "..."} or {"error": "..."}
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/jinja/template.h"

namespace {

nlohmann::ordered_json RenderCase(const std::string& source, const nlohmann::ordered_json& context,
                                  const tailserve::jinja::RenderOptions& options) {
  absl::StatusOr<tailserve::jinja::Template> t = tailserve::jinja::Template::Parse(source);
  if (!t.ok()) return {{"error", std::string(t.status().message())}};
  absl::StatusOr<std::string> text = t->Render(context, options);
  if (!text.ok()) return {{"error", std::string(text.status().message())}};
  return {{"ok", *text}};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tailserve-chat-template: render a chat template as the router does"};
  std::string template_path, context_path;
  bool batch = false;
  int64_t now = -1;
  app.add_option("--template", template_path, "the template file");
  app.add_option("--context", context_path, "JSON object: messages, add_generation_prompt, bos_token, ...");
  app.add_option("--now", now, "strftime_now's time, seconds since the epoch (default: the clock)");
  app.add_flag("--batch", batch, "JSON lines on stdin, one result line each on stdout");
  CLI11_PARSE(app, argc, argv);
  if (batch) {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.empty()) continue;
      nlohmann::ordered_json result;
      try {
        const auto in = nlohmann::ordered_json::parse(line);
        tailserve::jinja::RenderOptions o;
        if (in.contains("now")) o.now_unix = in["now"].get<int64_t>();
        result = RenderCase(in.at("template").get<std::string>(), in.value("context", nlohmann::ordered_json::object()), o);
      } catch (const std::exception& e) {
        result = {{"error", std::string("bad case: ") + e.what()}};
      }
      std::cout << result.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    }
    return 0;
  }
  if (template_path.empty()) {
    std::fprintf(stderr, "--template (or --batch) is required\n");
    return 2;
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (!context_path.empty()) {
    try {
      context = nlohmann::ordered_json::parse(ReadFile(context_path));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "--context: %s\n", e.what());
      return 2;
    }
  }
  tailserve::jinja::RenderOptions o;
  if (now >= 0) o.now_unix = now;
  const nlohmann::ordered_json r = RenderCase(ReadFile(template_path), context, o);
  if (r.contains("error")) {
    std::fprintf(stderr, "%s\n", r["error"].get<std::string>().c_str());
    return 1;
  }
  std::fwrite(r["ok"].get<std::string>().data(), 1, r["ok"].get<std::string>().size(), stdout);
  return 0;
}
