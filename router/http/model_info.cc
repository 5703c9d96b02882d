#include "router/http/model_info.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tailserve::http {

std::unique_ptr<ServedModel> LoadServedModel(const RouterConfig& config) {
  auto m = std::make_unique<ServedModel>();
  ModelInfo& info = m->info;
  info.max_tokens_limit = config.max_tokens_limit;
  const std::filesystem::path dir = std::filesystem::path(config.model_path).lexically_normal();
  info.name = !config.served_model_name.empty() ? config.served_model_name
              : config.model_path.empty()        ? "sim"
              : !dir.filename().empty()          ? dir.filename().string()
                                                 : dir.parent_path().filename().string();
  if (config.model_path.empty()) {
    info.chat_template_error = "the router has no model (router.model_path), so no chat template";
    return m;
  }
  const std::filesystem::path path = dir / "tokenizer_config.json";
  std::ifstream in(path);
  if (!in) {
    info.chat_template_error = absl::StrCat(path.string(), " is missing, so the model has no chat template");
    return m;
  }
  nlohmann::ordered_json tc;
  try {
    tc = nlohmann::ordered_json::parse(in);
  } catch (const std::exception& e) {
    info.chat_template_error = absl::StrCat(path.string(), ": ", e.what());
    spdlog::error("chat completions are off: {}", info.chat_template_error);
    return m;
  }
  // Special tokens as transformers passes them: strings, or AddedToken objects' content.
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    if (!tc.contains(name)) continue;
    const auto& v = tc[name];
    if (v.is_string()) info.special_tokens[name] = v;
    if (v.is_object() && v.contains("content") && v["content"].is_string()) info.special_tokens[name] = v["content"];
  }
  // A template string, or a list of named ones of which "default" is used.
  std::string source;
  if (tc.contains("chat_template") && tc["chat_template"].is_string()) {
    source = tc["chat_template"].get<std::string>();
  } else if (tc.contains("chat_template") && tc["chat_template"].is_array()) {
    for (const auto& t : tc["chat_template"]) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
        source = t["template"].get<std::string>();
      }
    }
  }
  if (source.empty()) {
    info.chat_template_error = absl::StrCat(path.string(), " has no chat_template");
    return m;
  }
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) {
    info.chat_template_error = absl::StrCat("the model's chat template is not supported: ", t.status().message());
    spdlog::error("chat completions are off: {}", info.chat_template_error);
    return m;
  }
  m->chat_template = *std::move(t);
  info.chat_template = &*m->chat_template;
  spdlog::info("chat template from {} ({} bytes)", path.string(), source.size());
  return m;
}

}  // namespace tailserve::http
