#include "common/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/jinja/unicode.h"

namespace tailserve::jinja {

const Value* Object::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

const Value* Args::Keyword(std::string_view name) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None{};
    case nlohmann::ordered_json::value_t::boolean:
      return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer:
      return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u);
      return static_cast<double>(u);
    }
    case nlohmann::ordered_json::value_t::number_float:
      return j.get<double>();
    case nlohmann::ordered_json::value_t::string:
      return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(FromJson(e));
      return a;
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      o.items.reserve(j.size());
      for (const auto& [k, v] : j.items()) o.items.emplace_back(k, FromJson(v));
      return o;
    }
    default:
      return None{};
  }
}

std::string Value::TypeName() const {
  switch (type()) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "NoneType";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "str";
    case Type::kArray: return "list";
    case Type::kObject: return "dict";
    case Type::kNamespace: return "Namespace";
    case Type::kCallable: return "function";
  }
  return "?";
}

bool Value::Truthy() const {
  switch (type()) {
    case Type::kUndefined:
    case Type::kNone: return false;
    case Type::kBool: return as_bool();
    case Type::kInt: return as_int() != 0;
    case Type::kFloat: return as_double() != 0.0;
    case Type::kString: return !as_string().empty();
    case Type::kArray: return !as_array().empty();
    case Type::kObject: return !as_object().items.empty();
    case Type::kNamespace:
    case Type::kCallable: return true;
  }
  return false;
}

bool Value::Equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (type() != o.type()) return false;
  switch (type()) {
    case Type::kUndefined:
    case Type::kNone: return true;
    case Type::kString: return as_string() == o.as_string();
    case Type::kArray: {
      const Array &a = as_array(), &b = o.as_array();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].Equals(b[i])) return false;
      }
      return true;
    }
    case Type::kObject: {
      const Object &a = as_object(), &b = o.as_object();
      if (a.items.size() != b.items.size()) return false;
      for (const auto& [k, v] : a.items) {
        const Value* w = b.Find(k);
        if (!w || !v.Equals(*w)) return false;
      }
      return true;
    }
    case Type::kNamespace: return &as_namespace() == &o.as_namespace();
    case Type::kCallable: return &as_callable() == &o.as_callable();
    default: return false;
  }
}

absl::StatusOr<bool> Value::Less(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_double() < o.as_double();
    return as_int() < o.as_int();
  }
  if (is_string() && o.is_string()) return as_string() < o.as_string();  // UTF-8 bytes sort as code points
  if (is_array() && o.is_array()) {
    const Array &a = as_array(), &b = o.as_array();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (a[i].Equals(b[i])) continue;
      return a[i].Less(b[i]);
    }
    return a.size() < b.size();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'<' not supported between instances of '", TypeName(), "' and '", o.TypeName(), "'"));
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // [-]D[.DDD]e±XX, the shortest digits that round-trip
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    const int n = static_cast<int>(digits.size());
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (exp + 1 >= n) {
      out += digits + std::string(static_cast<size_t>(exp + 1 - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

namespace {

std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : DecodeUtf8(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (!IsPythonPrintable(cp)) {
      char buf[16];
      if (cp <= 0xFF) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      } else if (cp <= 0xFFFF) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      AppendUtf8(cp, &out);
    }
  }
  out.push_back(quote);
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

absl::Status Json(const Value& v, const Value::JsonOptions& o, int depth, std::string* out) {
  const std::string item_sep = o.item_separator.value_or(o.indent ? "," : ", ");
  const std::string key_sep = o.key_separator.value_or(": ");
  auto newline = [&](int d) {
    if (!o.indent) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(*o.indent) * static_cast<size_t>(d), ' ');
  };
  switch (v.type()) {
    case Value::Type::kNone: *out += "null"; return absl::OkStatus();
    case Value::Type::kBool: *out += v.as_bool() ? "true" : "false"; return absl::OkStatus();
    case Value::Type::kInt: *out += std::to_string(v.as_int()); return absl::OkStatus();
    case Value::Type::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : FloatRepr(d);
      return absl::OkStatus();
    }
    case Value::Type::kString: JsonString(v.as_string(), out); return absl::OkStatus();
    case Value::Type::kArray: {
      const Array& a = v.as_array();
      if (a.empty()) return *out += "[]", absl::OkStatus();
      out->push_back('[');
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        if (absl::Status s = Json(a[i], o, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Type::kObject: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_object().items) items.push_back(&kv);
      if (items.empty()) return *out += "{}", absl::OkStatus();
      if (o.sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, out);
        *out += key_sep;
        if (absl::Status s = Json(items[i]->second, o, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("tojson: Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

std::string Value::Repr() const {
  switch (type()) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "None";
    case Type::kBool: return as_bool() ? "True" : "False";
    case Type::kInt: return std::to_string(as_int());
    case Type::kFloat: return FloatRepr(as_double());
    case Type::kString: return StringRepr(as_string());
    case Type::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < as_array().size(); ++i) out += (i ? ", " : "") + as_array()[i].Repr();
      return out + "]";
    }
    case Type::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : as_object().items) out += (first ? "" : ", ") + StringRepr(k) + ": " + v.Repr(), first = false;
      return out + "}";
    }
    case Type::kNamespace: return "<Namespace " + Value(as_namespace().attrs).Repr() + ">";
    case Type::kCallable: return "<function " + as_callable().name + ">";
  }
  return "";
}

std::string Value::Str() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  return Repr();
}

absl::StatusOr<std::string> Value::ToJson(const JsonOptions& options) const {
  std::string out;
  if (absl::Status s = Json(*this, options, 0, &out); !s.ok()) return s;
  return out;
}

}  // namespace tailserve::jinja
