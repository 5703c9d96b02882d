#pragma once
// The values a chat template computes with, with Python's semantics as jinja2 applies them (the
// renderer's byte-exact target, docs/chat-templates.md): ints and floats kept apart, dicts in
// insertion order, str() and repr() as Python prints them, json.dumps(ensure_ascii=False) for
// tojson, and jinja2's Undefined for what a template reads but the context lacks. Containers are
// shared (a namespace set inside a loop is seen after it), as Python's references are.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include <nlohmann/json.hpp>

namespace tailserve::jinja {

class Value;
using Array = std::vector<Value>;

// A dict with string keys in insertion order (templates and JSON contexts have no other keys).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value value);
};

// Positional and keyword arguments of a call, a filter or a test.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* Keyword(std::string_view name) const;
};
using Function = std::function<absl::StatusOr<Value>(const Args&)>;

struct Undefined {
  std::string name;  // what was looked up, for errors
};
struct None {};
// namespace(): the one mutable object of a sandboxed template.
struct Namespace {
  Object attrs;
};
struct Callable {
  std::string name;
  Function fn;
};

class Value {
 public:
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kNamespace, kCallable };

  Value() : v_(Undefined{}) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}
  Value(std::shared_ptr<Namespace> n) : v_(std::move(n)) {}
  Value(std::shared_ptr<Callable> c) : v_(std::move(c)) {}
  static Value FromJson(const nlohmann::ordered_json& j);

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_undefined() const { return type() == Type::kUndefined; }
  bool is_none() const { return type() == Type::kNone; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_float() const { return type() == Type::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python's bool is an int
  bool is_string() const { return type() == Type::kString; }
  bool is_array() const { return type() == Type::kArray; }
  bool is_object() const { return type() == Type::kObject; }
  bool is_namespace() const { return type() == Type::kNamespace; }
  bool is_callable() const { return type() == Type::kCallable; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<int64_t>(v_); }
  double as_double() const { return is_float() ? std::get<double>(v_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  const Object& as_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Python's name of the type, for errors ("str", "int", "list", "dict", "NoneType", ...).
  std::string TypeName() const;
  bool Truthy() const;
  // Python ==: deep, with no coercion except between numbers (1 == 1.0 == True).
  bool Equals(const Value& other) const;
  // Python's <, for numbers, strings (by code point) and lists; INVALID_ARGUMENT otherwise.
  absl::StatusOr<bool> Less(const Value& other) const;
  // str(x) as jinja2 prints {{ x }}: Undefined prints nothing, None "None", True "True",
  // containers as Python's repr.
  std::string Str() const;
  std::string Repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...): transformers'
  // tojson. Undefined, namespaces and callables are refused, as Python refuses them.
  struct JsonOptions {
    std::optional<int> indent;
    std::optional<std::string> item_separator, key_separator;
    bool sort_keys = false;
  };
  absl::StatusOr<std::string> ToJson(const JsonOptions& options) const;

 private:
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<Array>, std::shared_ptr<Object>,
               std::shared_ptr<Namespace>, std::shared_ptr<Callable>>
      v_;
};

// Python's repr of a float: the shortest digits that round-trip, fixed notation for decimal
// exponents -4..15 (with ".0" when integral), otherwise 1e+16 / 1.5e-07; nan, inf.
std::string FloatRepr(double d);

}  // namespace tailserve::jinja
