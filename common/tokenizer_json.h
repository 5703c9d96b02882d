#pragma once
// Reading the components of a tokenizer.json: fields with HF's defaults, and errors that name the
// field (BpeTokenizer::Load adds the file).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tailserve::bpe_internal {

inline std::string JsonTypeName(const nlohmann::json& j) {
  return j.is_null() ? "null" : j.type_name();
}

// The "type" field of a component, or "" when absent.
inline std::string ComponentType(const nlohmann::json& j) {
  const auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

inline absl::Status FieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(std::string(field) + ": " + std::string(what));
}

// The member `name` of `j` by reference (the model object is large: never copy it), or null.
inline const nlohmann::json& Field(const nlohmann::json& j, const char* name) {
  static const nlohmann::json* const kNull = new nlohmann::json();
  if (!j.is_object()) return *kNull;
  const auto it = j.find(name);
  return it == j.end() ? *kNull : *it;
}

inline bool BoolField(const nlohmann::json& j, const char* name, bool default_value) {
  const auto it = j.find(name);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : default_value;
}

}  // namespace tailserve::bpe_internal
