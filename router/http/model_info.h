#pragma once
// What the HTTP API serves, read once at start: the model's name and, from router.model_path's
// tokenizer_config.json, its chat template (parsed: a template using a feature the renderer does
// not support is refused here, naming it, and chat completions say so) and special tokens.
#include <memory>
#include <optional>

#include "common/config.h"
#include "common/jinja/template.h"
#include "router/http/openai_api.h"

namespace tailserve::http {

struct ServedModel {
  std::optional<jinja::Template> chat_template;
  ModelInfo info;  // info.chat_template points at chat_template
};

std::unique_ptr<ServedModel> LoadServedModel(const RouterConfig& config);

}  // namespace tailserve::http
