#pragma once
// jinja2's filters, tests and globals and Python's str/dict methods, as chat templates use them
// (docs/chat-templates.md §3), with transformers' tojson, raise_exception and strftime_now.
// Unknown names are errors, never silently empty.
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/jinja/template.h"
#include "common/jinja/value.h"

namespace tailserve::jinja {

// `args.positional[0]` is the filtered value. NOT_FOUND for an unknown filter.
absl::StatusOr<Value> ApplyFilter(std::string_view name, const Args& args);
// `args.positional[0]` is the tested value. NOT_FOUND for an unknown test.
absl::StatusOr<bool> ApplyTest(std::string_view name, const Args& args);
// The globals every template sees: namespace, raise_exception, range, dict, strftime_now.
Object Globals(const RenderOptions& options);
// `obj.name` where obj is a str or dict and name one of its methods: the bound method; nullopt
// when it has no such method.
std::optional<Value> Method(const Value& obj, std::string_view name);
// x[i] and x[a:b:c] with Python's rules (negative indices, clamped slices); a missing key or an
// index out of range is Undefined, as in jinja2.
Value GetItem(const Value& obj, const Value& key);
absl::StatusOr<Value> Slice(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
                            std::optional<int64_t> step);
// What `for` iterates: a list's items, a dict's keys, a string's characters; Undefined is empty.
absl::StatusOr<Array> Iterate(const Value& v);

}  // namespace tailserve::jinja
