#pragma once
// Helpers the builtins (builtins.cc) and the filters (filters.cc) share; not part of the API.
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/jinja/value.h"

namespace tailserve::jinja::internal {

absl::Status Invalid(std::string_view what);
// The n-th argument (positional, else by keyword), or null.
const Value* Arg(const Args& a, size_t n, std::string_view keyword);
Value MakeFunction(std::string name, Function fn);
// len() in code points for str; -1 for a value without a length.
int64_t Length(const Value& v);
// str.split(sep=None, maxsplit=-1) and str.rsplit.
absl::StatusOr<Value> Split(const std::string& s, const Value* sep, const Value* maxsplit, bool from_right);
// str.replace(old, new, count=-1).
std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
// A dict's (key, value) pairs as two-item lists: items(), |items, |dictsort.
Array ItemPairs(const Object& o);
// jinja2's attribute lookup for filters' attribute= arguments: "a.b" and "a.0" paths.
Value Attribute(const Value& v, const std::string& path);

}  // namespace tailserve::jinja::internal
