// jinja2's filters (builtins.h), with transformers' tojson.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/jinja/builtins.h"
#include "common/jinja/builtins_util.h"
#include "common/jinja/unicode.h"

namespace tailserve::jinja {
namespace {

using internal::Arg;
using internal::Attribute;
using internal::Invalid;
using internal::ItemPairs;
using internal::Length;
using internal::MakeFunction;
using internal::Replace;
using internal::Split;

absl::StatusOr<Value> JsonFilter(const Args& a) {
  Value::JsonOptions o;
  if (const Value* ascii = Arg(a, 1, "ensure_ascii"); ascii && ascii->Truthy()) {
    return Invalid("tojson(ensure_ascii=true) is not supported");
  }
  if (const Value* indent = Arg(a, 2, "indent"); indent && !indent->is_none()) {
    if (!indent->is_int()) return Invalid("tojson: indent must be an integer");
    o.indent = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64));
  }
  if (const Value* seps = Arg(a, 3, "separators"); seps && !seps->is_none()) {
    if (!seps->is_array() || seps->as_array().size() != 2 || !seps->as_array()[0].is_string() ||
        !seps->as_array()[1].is_string()) {
      return Invalid("tojson: separators must be a pair of strings");
    }
    o.item_separator = seps->as_array()[0].as_string();
    o.key_separator = seps->as_array()[1].as_string();
  }
  if (const Value* sort = Arg(a, 4, "sort_keys")) o.sort_keys = sort->Truthy();
  absl::StatusOr<std::string> s = a.positional[0].ToJson(o);
  if (!s.ok()) return s.status();
  return Value(*std::move(s));
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectFilter(const Args& a, bool by_attribute, bool keep_when) {
  absl::StatusOr<Array> items = Iterate(a.positional[0]);
  if (!items.ok()) return items.status();
  size_t next = 1;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.size() < 2 || !a.positional[1].is_string()) return Invalid("selectattr: expected an attribute name");
    attribute = a.positional[1].as_string();
    next = 2;
  }
  std::optional<std::string> test;
  if (a.positional.size() > next) {
    if (!a.positional[next].is_string()) return Invalid("select: the test name must be a string");
    test = a.positional[next].as_string();
  }
  Array out;
  for (const Value& item : *items) {
    const Value subject = by_attribute ? Attribute(item, attribute) : item;
    bool pass = subject.Truthy();
    if (test) {
      Args t;
      t.positional.push_back(subject);
      for (size_t k = next + 1; k < a.positional.size(); ++k) t.positional.push_back(a.positional[k]);
      absl::StatusOr<bool> r = ApplyTest(*test, t);
      if (absl::IsNotFound(r.status())) return Invalid(absl::StrCat("no test named '", *test, "'"));
      if (!r.ok()) return r.status();
      pass = *r;
    }
    if (pass == keep_when) out.push_back(item);
  }
  return Value(std::move(out));
}

absl::StatusOr<Value> MapFilter(const Args& a) {
  absl::StatusOr<Array> items = Iterate(a.positional[0]);
  if (!items.ok()) return items.status();
  Array out;
  if (const Value* attr = a.Keyword("attribute")) {
    if (!attr->is_string()) return Invalid("map: attribute must be a string");
    const Value* d = a.Keyword("default");
    for (const Value& item : *items) {
      Value v = Attribute(item, attr->as_string());
      out.push_back(v.is_undefined() && d ? *d : v);
    }
    return Value(std::move(out));
  }
  if (a.positional.size() < 2 || !a.positional[1].is_string()) return Invalid("map: expected a filter name or attribute=");
  for (const Value& item : *items) {
    Args f;
    f.positional.push_back(item);
    for (size_t k = 2; k < a.positional.size(); ++k) f.positional.push_back(a.positional[k]);
    f.keyword = a.keyword;
    absl::StatusOr<Value> v = ApplyFilter(a.positional[1].as_string(), f);
    if (absl::IsNotFound(v.status())) return Invalid(absl::StrCat("no filter named '", a.positional[1].as_string(), "'"));
    if (!v.ok()) return v.status();
    out.push_back(*std::move(v));
  }
  return Value(std::move(out));
}

// sort / unique / min / max compare strings case-insensitively unless case_sensitive (jinja2).
Value SortKey(const Value& v, bool case_sensitive, const std::string& attribute) {
  Value k = attribute.empty() ? v : Attribute(v, attribute);
  if (!case_sensitive && k.is_string()) return Value(Lower(k.as_string()));
  return k;
}

// Sorts `items` stably by key(item), keys compared with Python's < (an error for keys that do not
// compare), each key computed once. Reversed as Python's sorted(reverse=True) is: items with equal
// keys keep their order.
absl::StatusOr<Value> SortByKey(Array items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) keys.push_back(key(item));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    absl::StatusOr<bool> lt = reverse ? keys[y].Less(keys[x]) : keys[x].Less(keys[y]);
    if (!lt.ok()) error = lt.status();
    return lt.ok() && *lt;
  });
  if (!error.ok()) return error;
  Array sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(std::move(items[i]));
  return Value(std::move(sorted));
}

absl::StatusOr<Value> SortFilter(const Args& a) {
  absl::StatusOr<Array> items = Iterate(a.positional[0]);
  if (!items.ok()) return items.status();
  const Value* rev = Arg(a, 1, "reverse");
  const Value* cs = Arg(a, 2, "case_sensitive");
  const Value* attr = Arg(a, 3, "attribute");
  const std::string attribute = attr && attr->is_string() ? attr->as_string() : "";
  const bool case_sensitive = cs && cs->Truthy();
  return SortByKey(*std::move(items), [&](const Value& x) { return SortKey(x, case_sensitive, attribute); },
                   rev && rev->Truthy());
}

absl::StatusOr<Value> Extreme(const Args& a, bool max) {
  absl::StatusOr<Array> items = Iterate(a.positional[0]);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value(Undefined{max ? "max" : "min"});
  const Value* cs = Arg(a, 1, "case_sensitive");
  const Value* attr = Arg(a, 2, "attribute");
  const std::string attribute = attr && attr->is_string() ? attr->as_string() : "";
  size_t best = 0;
  for (size_t i = 1; i < items->size(); ++i) {
    const Value ki = SortKey((*items)[i], cs && cs->Truthy(), attribute);
    const Value kb = SortKey((*items)[best], cs && cs->Truthy(), attribute);
    absl::StatusOr<bool> lt = max ? kb.Less(ki) : ki.Less(kb);
    if (!lt.ok()) return lt.status();
    if (*lt) best = i;
  }
  return (*items)[best];
}

std::string Indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t at = 0;
  bool is_first = true;
  while (at <= s.size()) {
    const size_t nl = s.find('\n', at);
    const std::string line = s.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if (!is_first) out.push_back('\n');
    if ((!is_first || first) && (blank || !line.empty())) out += pad;
    out += line;
    is_first = false;
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Args& a) {
  const Value& v = a.positional[0];
  if (name == "trim") {
    const Value* chars = Arg(a, 1, "chars");
    return Value(Strip(v.Str(), chars && chars->is_string() ? &chars->as_string() : nullptr, true, true));
  }
  if (name == "length" || name == "count") {
    if (v.is_undefined()) return Value(int64_t{0});
    const int64_t n = Length(v);
    if (n < 0) return Invalid(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
    return Value(n);
  }
  if (name == "tojson") return JsonFilter(a);
  if (name == "items") {
    if (v.is_undefined()) return Value(Array{});
    if (!v.is_object()) return Invalid("Can only get item pairs from a mapping.");
    return Value(ItemPairs(v.as_object()));
  }
  if (name == "join") {
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return items.status();
    const Value* sep = Arg(a, 1, "d");
    const Value* attr = Arg(a, 2, "attribute");
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      if (i && sep) out += sep->Str();
      out += (attr && attr->is_string() ? Attribute((*items)[i], attr->as_string()) : (*items)[i]).Str();
    }
    return Value(std::move(out));
  }
  if (name == "select") return SelectFilter(a, false, true);
  if (name == "reject") return SelectFilter(a, false, false);
  if (name == "selectattr") return SelectFilter(a, true, true);
  if (name == "rejectattr") return SelectFilter(a, true, false);
  if (name == "map") return MapFilter(a);
  if (name == "string") return Value(v.Str());
  if (name == "default" || name == "d") {
    const Value* d = Arg(a, 1, "default_value");
    const Value* boolean = Arg(a, 2, "boolean");
    if (v.is_undefined() || (boolean && boolean->Truthy() && !v.Truthy())) return d ? *d : Value("");
    return v;
  }
  if (name == "first" || name == "last") {
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return items.status();
    if (items->empty()) return Value(Undefined{std::string(name)});
    return name == "first" ? items->front() : items->back();
  }
  if (name == "lower") return Value(Lower(v.Str()));
  if (name == "upper") return Value(Upper(v.Str()));
  if (name == "capitalize") return Value(Capitalize(v.Str()));
  if (name == "title") return Value(Title(v.Str()));
  if (name == "replace") {
    if (a.positional.size() < 3) return Invalid("replace: expected old and new");
    const int64_t count = a.positional.size() > 3 ? a.positional[3].as_int() : -1;
    return Value(Replace(v.Str(), a.positional[1].Str(), a.positional[2].Str(), count));
  }
  if (name == "int") {
    const Value* d = Arg(a, 1, "default");
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.is_float() && std::isfinite(v.as_double())) return Value(static_cast<int64_t>(v.as_double()));
    if (v.is_string()) {
      const std::string t = Strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      const long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && end && *end == '\0') return Value(static_cast<int64_t>(x));
      const double f = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == '\0' && std::isfinite(f)) return Value(static_cast<int64_t>(f));
    }
    return d ? *d : Value(int64_t{0});
  }
  if (name == "float") {
    const Value* d = Arg(a, 1, "default");
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      const std::string t = Strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      const double f = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == '\0') return Value(f);
    }
    return d ? *d : Value(0.0);
  }
  if (name == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    return Invalid(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
  }
  if (name == "round") {
    if (!v.is_number()) return Invalid("round: expected a number");
    const Value* p = Arg(a, 1, "precision");
    const Value* m = Arg(a, 2, "method");
    const int64_t digits = p ? p->as_int() : 0;
    const std::string method = m && m->is_string() ? m->as_string() : "common";
    const double scale = std::pow(10.0, static_cast<double>(digits));
    const double x = v.as_double() * scale;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value(r / scale);
  }
  if (name == "list") {
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return items.status();
    return Value(*std::move(items));
  }
  if (name == "reverse") {
    if (v.is_string()) return Slice(v, std::nullopt, std::nullopt, -1);
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    return Value(*std::move(items));
  }
  if (name == "sort") return SortFilter(a);
  if (name == "batch") {
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return items.status();
    const Value* count = Arg(a, 1, "linecount");
    const Value* fill = Arg(a, 2, "fill_with");
    if (!count || !count->is_int() || count->as_int() <= 0) return Invalid("batch: linecount must be a positive integer");
    const size_t n = static_cast<size_t>(count->as_int());
    Array out;
    for (size_t i = 0; i < items->size(); i += n) {
      Array group(items->begin() + static_cast<std::ptrdiff_t>(i),
                  items->begin() + static_cast<std::ptrdiff_t>(std::min(items->size(), i + n)));
      while (fill && !fill->is_none() && group.size() < n) group.push_back(*fill);
      out.push_back(Value(std::move(group)));
    }
    return Value(std::move(out));
  }
  if (name == "unique") {
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return items.status();
    const Value* cs = Arg(a, 1, "case_sensitive");
    const Value* attr = Arg(a, 2, "attribute");
    const std::string attribute = attr && attr->is_string() ? attr->as_string() : "";
    Array out, seen;
    for (const Value& item : *items) {
      const Value k = SortKey(item, cs && cs->Truthy(), attribute);
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(k); })) continue;
      seen.push_back(k);
      out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "min") return Extreme(a, false);
  if (name == "max") return Extreme(a, true);
  if (name == "sum") {
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return items.status();
    const Value* attr = Arg(a, 1, "attribute");
    const Value* start = Arg(a, 2, "start");
    Value total = start ? *start : Value(int64_t{0});
    for (const Value& item : *items) {
      const Value x = attr && attr->is_string() ? Attribute(item, attr->as_string()) : item;
      if (!x.is_number() || !total.is_number()) return Invalid(absl::StrCat("unsupported operand type(s) for +: '", total.TypeName(), "' and '", x.TypeName(), "'"));
      total = total.is_float() || x.is_float() ? Value(total.as_double() + x.as_double()) : Value(total.as_int() + x.as_int());
    }
    return total;
  }
  if (name == "safe") return v;
  if (name == "escape" || name == "e" || name == "forceescape") return Value(HtmlEscape(v.Str()));
  if (name == "indent") {
    const Value* width = Arg(a, 1, "width");
    const Value* first = Arg(a, 2, "first");
    const Value* blank = Arg(a, 3, "blank");
    const std::string pad = width && width->is_string() ? width->as_string()
                                                         : std::string(static_cast<size_t>(std::clamp<int64_t>(width ? width->as_int() : 4, 0, 256)), ' ');
    return Value(Indent(v.Str(), pad, first && first->Truthy(), blank && blank->Truthy()));
  }
  if (name == "wordcount") {
    absl::StatusOr<Value> words = Split(v.Str(), nullptr, nullptr, false);
    if (!words.ok()) return words.status();
    return Value(static_cast<int64_t>(words->as_array().size()));
  }
  if (name == "dictsort") {
    if (!v.is_object()) return Invalid("dictsort: expected a mapping");
    const Value* cs = Arg(a, 1, "case_sensitive");
    const Value* by = Arg(a, 2, "by");
    const Value* rev = Arg(a, 3, "reverse");
    const size_t by_value = by && by->is_string() && by->as_string() == "value" ? 1 : 0;
    const bool case_sensitive = cs && cs->Truthy();
    return SortByKey(ItemPairs(v.as_object()),
                     [&](const Value& pair) { return SortKey(pair.as_array()[by_value], case_sensitive, ""); },
                     rev && rev->Truthy());
  }
  return absl::NotFoundError(std::string(name));
}

}  // namespace tailserve::jinja
