#include "common/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/jinja/builtins_util.h"
#include "common/jinja/unicode.h"

namespace tailserve::jinja {
namespace internal {

absl::Status Invalid(std::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

// The n-th argument (positional, else by keyword), or null.
const Value* Arg(const Args& a, size_t n, std::string_view keyword) {
  if (n < a.positional.size()) return &a.positional[n];
  return a.Keyword(keyword);
}

Value MakeFunction(std::string name, Function fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

int64_t Length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(DecodeUtf8(v.as_string()).size());
  if (v.is_array()) return static_cast<int64_t>(v.as_array().size());
  if (v.is_object()) return static_cast<int64_t>(v.as_object().items.size());
  return -1;
}

// str.split(sep=None, maxsplit=-1) and rsplit.
absl::StatusOr<Value> Split(const std::string& s, const Value* sep, const Value* maxsplit, bool from_right) {
  int64_t max = maxsplit && !maxsplit->is_none() ? maxsplit->as_int() : -1;
  std::vector<std::string> parts;
  if (!sep || sep->is_none()) {
    const std::vector<char32_t> cps = DecodeUtf8(s);
    std::vector<std::pair<size_t, size_t>> words;  // code point ranges
    for (size_t i = 0; i < cps.size();) {
      while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    auto text = [&](size_t b, size_t e) {
      return EncodeUtf8(std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b),
                                              cps.begin() + static_cast<std::ptrdiff_t>(e)));
    };
    if (max < 0 || static_cast<size_t>(max) >= words.size()) {
      for (auto [b, e] : words) parts.push_back(text(b, e));
    } else if (!from_right) {
      for (int64_t k = 0; k < max; ++k) parts.push_back(text(words[k].first, words[k].second));
      size_t e = cps.size();
      while (e > 0 && IsPythonSpace(cps[e - 1])) --e;
      parts.push_back(text(words[static_cast<size_t>(max)].first, e));
    } else {
      const size_t keep = words.size() - static_cast<size_t>(max);
      size_t b = 0;
      while (b < cps.size() && IsPythonSpace(cps[b])) ++b;
      parts.push_back(text(b, words[keep - 1].second));
      for (size_t k = keep; k < words.size(); ++k) parts.push_back(text(words[k].first, words[k].second));
    }
  } else {
    if (!sep->is_string()) return Invalid("must be str or None");
    const std::string& d = sep->as_string();
    if (d.empty()) return Invalid("empty separator");
    if (!from_right) {
      size_t at = 0;
      for (size_t f; (max < 0 || static_cast<int64_t>(parts.size()) < max) && (f = s.find(d, at)) != std::string::npos;
           at = f + d.size()) {
        parts.push_back(s.substr(at, f - at));
      }
      parts.push_back(s.substr(at));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (max < 0 || static_cast<int64_t>(rev.size()) < max) {
        if (end < d.size()) break;
        const size_t f = s.rfind(d, end - d.size());
        if (f == std::string::npos) break;
        rev.push_back(s.substr(f + d.size(), end - f - d.size()));
        end = f;
      }
      parts.push_back(s.substr(0, end));
      parts.insert(parts.end(), rev.rbegin(), rev.rend());
    }
  }
  Array a;
  for (std::string& p : parts) a.push_back(Value(std::move(p)));
  return Value(std::move(a));
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {  // Python inserts `to` around every character
    const std::vector<char32_t> cps = DecodeUtf8(s);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) out += to, ++done;
      if (i < cps.size()) AppendUtf8(cps[i], &out);
    }
    return out;
  }
  std::string out;
  size_t at = 0;
  int64_t done = 0;
  for (size_t f; (count < 0 || done < count) && (f = s.find(from, at)) != std::string::npos; at = f + from.size(), ++done) {
    out += s.substr(at, f - at) + to;
  }
  return out + s.substr(at);
}

Value Attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t at = 0;
  while (at <= path.size()) {
    const size_t dot = path.find('.', at);
    const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      cur = GetItem(cur, Value(static_cast<int64_t>(std::stoll(part))));
    } else if (cur.is_namespace()) {
      const Value* f = cur.as_namespace().attrs.Find(part);
      cur = f ? *f : Value(Undefined{part});
    } else {
      cur = GetItem(cur, Value(part));
    }
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  return cur;
}

Array ItemPairs(const Object& o) {
  Array out;
  out.reserve(o.items.size());
  for (const auto& [k, v] : o.items) out.push_back(Value(Array{Value(k), v}));
  return out;
}

}  // namespace internal

namespace {

using internal::Arg;
using internal::Attribute;
using internal::Invalid;
using internal::ItemPairs;
using internal::Length;
using internal::MakeFunction;
using internal::Replace;
using internal::Split;

absl::StatusOr<bool> AffixTest(const std::string& s, const Value& what, bool prefix) {
  auto one = [&](const Value& v) -> absl::StatusOr<bool> {
    if (!v.is_string()) return Invalid(absl::StrCat(prefix ? "startswith" : "endswith", " first arg must be str or a tuple of str"));
    const std::string& a = v.as_string();
    return a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (!what.is_array()) return one(what);
  for (const Value& v : what.as_array()) {
    absl::StatusOr<bool> r = one(v);
    if (!r.ok() || *r) return r;
  }
  return false;
}

std::optional<Value> StringMethod(const std::string& s, std::string_view name) {
  auto bind = [&](Function f) { return MakeFunction(std::string(name), std::move(f)); };
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bind([s, prefix](const Args& a) -> absl::StatusOr<Value> {
      if (a.positional.empty()) return Invalid("expected at least 1 argument");
      absl::StatusOr<bool> r = AffixTest(s, a.positional[0], prefix);
      if (!r.ok()) return r.status();
      return Value(*r);
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return bind([s, right](const Args& a) { return Split(s, Arg(a, 0, "sep"), Arg(a, 1, "maxsplit"), right); });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return bind([s, left, right](const Args& a) -> absl::StatusOr<Value> {
      const Value* chars = Arg(a, 0, "chars");
      if (chars && !chars->is_none() && !chars->is_string()) return Invalid("strip arg must be None or str");
      return Value(Strip(s, chars && chars->is_string() ? &chars->as_string() : nullptr, left, right));
    });
  }
  if (name == "upper") return bind([s](const Args&) -> absl::StatusOr<Value> { return Value(Upper(s)); });
  if (name == "lower") return bind([s](const Args&) -> absl::StatusOr<Value> { return Value(Lower(s)); });
  if (name == "title") return bind([s](const Args&) -> absl::StatusOr<Value> { return Value(Title(s)); });
  if (name == "capitalize") return bind([s](const Args&) -> absl::StatusOr<Value> { return Value(Capitalize(s)); });
  if (name == "replace") {
    return bind([s](const Args& a) -> absl::StatusOr<Value> {
      if (a.positional.size() < 2 || !a.positional[0].is_string() || !a.positional[1].is_string()) {
        return Invalid("replace() takes two str arguments");
      }
      const int64_t count = a.positional.size() > 2 ? a.positional[2].as_int() : -1;
      return Value(Replace(s, a.positional[0].as_string(), a.positional[1].as_string(), count));
    });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return bind([s, find](const Args& a) -> absl::StatusOr<Value> {
      if (a.positional.empty() || !a.positional[0].is_string()) return Invalid("must be str");
      const std::string& sub = a.positional[0].as_string();
      if (find) {
        const size_t f = s.find(sub);
        return Value(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(DecodeUtf8(s.substr(0, f)).size()));
      }
      if (sub.empty()) return Value(static_cast<int64_t>(DecodeUtf8(s).size()) + 1);
      int64_t n = 0;
      for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return bind([s](const Args& a) -> absl::StatusOr<Value> {
      if (a.positional.empty()) return Invalid("join() takes exactly one argument");
      absl::StatusOr<Array> items = Iterate(a.positional[0]);
      if (!items.ok()) return items.status();
      std::string out;
      for (size_t i = 0; i < items->size(); ++i) {
        if (!(*items)[i].is_string()) return Invalid(absl::StrCat("sequence item ", i, ": expected str instance, ", (*items)[i].TypeName(), " found"));
        if (i) out += s;
        out += (*items)[i].as_string();
      }
      return Value(std::move(out));
    });
  }
  return std::nullopt;
}

std::optional<Value> DictMethod(const Value& obj, std::string_view name) {
  auto bind = [&](Function f) { return MakeFunction(std::string(name), std::move(f)); };
  if (name == "get") {
    return bind([obj](const Args& a) -> absl::StatusOr<Value> {
      if (a.positional.empty()) return Invalid("get expected at least 1 argument");
      const Value* d = a.positional.size() > 1 ? &a.positional[1] : nullptr;
      if (!a.positional[0].is_string()) return d ? *d : Value(None{});
      const Value* f = obj.as_object().Find(a.positional[0].as_string());
      return f ? *f : d ? *d : Value(None{});
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    const std::string which(name);
    return bind([obj, which](const Args&) -> absl::StatusOr<Value> {
      if (which == "items") return Value(ItemPairs(obj.as_object()));
      Array out;
      for (const auto& [k, v] : obj.as_object().items) out.push_back(which == "keys" ? Value(k) : v);
      return Value(std::move(out));
    });
  }
  return std::nullopt;
}

// jinja2's attribute lookup for filters' attribute= arguments: "a.b" and "a.0" paths.
}  // namespace

std::optional<Value> Method(const Value& obj, std::string_view name) {
  if (obj.is_string()) return StringMethod(obj.as_string(), name);
  if (obj.is_object()) return DictMethod(obj, name);
  return std::nullopt;
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_object()) {
    if (!key.is_string()) return Undefined{key.Str()};
    const Value* f = obj.as_object().Find(key.as_string());
    return f ? *f : Value(Undefined{key.as_string()});
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_array()) {
      const int64_t n = static_cast<int64_t>(obj.as_array().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined{"index out of range"};
      return obj.as_array()[static_cast<size_t>(i)];
    }
    const std::vector<char32_t> cps = DecodeUtf8(obj.as_string());
    const int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Undefined{"index out of range"};
    std::string out;
    AppendUtf8(cps[static_cast<size_t>(i)], &out);
    return Value(std::move(out));
  }
  if (obj.is_namespace() && key.is_string()) {
    const Value* f = obj.as_namespace().attrs.Find(key.as_string());
    return f ? *f : Value(Undefined{key.as_string()});
  }
  return Undefined{key.Str()};
}

absl::StatusOr<Value> Slice(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
                            std::optional<int64_t> step) {
  const int64_t s = step.value_or(1);
  if (s == 0) return Invalid("slice step cannot be zero");
  std::vector<char32_t> cps;
  int64_t n = 0;
  if (obj.is_string()) {
    cps = DecodeUtf8(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_array()) {
    n = static_cast<int64_t>(obj.as_array().size());
  } else {
    return Invalid(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = s < 0 ? -1 : 0;
    } else if (x >= n) {
      x = s < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t b = adjust(start, s < 0 ? n - 1 : 0), e = adjust(stop, s < 0 ? -1 : n);
  std::vector<int64_t> idx;
  for (int64_t i = b; s > 0 ? i < e : i > e; i += s) idx.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) AppendUtf8(cps[static_cast<size_t>(i)], &out);
    return Value(std::move(out));
  }
  Array out;
  for (int64_t i : idx) out.push_back(obj.as_array()[static_cast<size_t>(i)]);
  return Value(std::move(out));
}

absl::StatusOr<Array> Iterate(const Value& v) {
  if (v.is_undefined()) return Array{};
  if (v.is_array()) return v.as_array();
  if (v.is_object()) {
    Array keys;
    for (const auto& kv : v.as_object().items) keys.push_back(Value(kv.first));
    return keys;
  }
  if (v.is_string()) {
    Array chars;
    for (char32_t cp : DecodeUtf8(v.as_string())) {
      std::string c;
      AppendUtf8(cp, &c);
      chars.push_back(Value(std::move(c)));
    }
    return chars;
  }
  return Invalid(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

absl::StatusOr<bool> ApplyTest(std::string_view name, const Args& a) {
  const Value& v = a.positional[0];
  const Value* arg = a.positional.size() > 1 ? &a.positional[1] : nullptr;
  auto need = [&]() -> absl::Status {
    return arg ? absl::OkStatus() : Invalid(absl::StrCat("test '", std::string(name), "' expects an argument"));
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_int() || v.is_float() || v.is_bool();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object();
  if (name == "callable") return v.is_callable();
  if (name == "lower") return v.is_string() && Lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && Upper(v.as_string()) == v.as_string();
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) return Invalid(absl::StrCat("test '", std::string(name), "' expects an integer"));
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    if (absl::Status s = need(); !s.ok()) return s;
    if (!arg->is_int() || arg->as_int() == 0 || !v.is_int()) return Invalid("divisibleby expects non-zero integers");
    return v.as_int() % arg->as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return need().ok() ? absl::StatusOr<bool>(v.Equals(*arg)) : need();
  if (name == "ne" || name == "!=") return need().ok() ? absl::StatusOr<bool>(!v.Equals(*arg)) : need();
  if (name == "sameas") {
    if (absl::Status s = need(); !s.ok()) return s;
    if (v.is_none() || v.is_bool()) return v.type() == arg->type() && v.Equals(*arg);
    return false;
  }
  if (name == "lt" || name == "<" || name == "ge" || name == ">=") {
    if (absl::Status s = need(); !s.ok()) return s;
    absl::StatusOr<bool> lt = v.Less(*arg);
    if (!lt.ok()) return lt.status();
    return (name == "lt" || name == "<") == *lt;
  }
  if (name == "gt" || name == ">" || name == "le" || name == "<=") {
    if (absl::Status s = need(); !s.ok()) return s;
    absl::StatusOr<bool> gt = arg->Less(v);
    if (!gt.ok()) return gt.status();
    return (name == "gt" || name == ">") == *gt;
  }
  if (name == "in") {
    if (absl::Status s = need(); !s.ok()) return s;
    if (arg->is_string()) return v.is_string() && arg->as_string().find(v.as_string()) != std::string::npos;
    if (arg->is_object()) return v.is_string() && arg->as_object().Find(v.as_string()) != nullptr;
    if (arg->is_array()) {
      return std::any_of(arg->as_array().begin(), arg->as_array().end(), [&](const Value& x) { return x.Equals(v); });
    }
    return Invalid(absl::StrCat("argument of type '", arg->TypeName(), "' is not iterable"));
  }
  return absl::NotFoundError(std::string(name));
}

Object Globals(const RenderOptions& options) {
  Object g;
  g.Set("namespace", MakeFunction("namespace", [](const Args& a) -> absl::StatusOr<Value> {
          auto ns = std::make_shared<Namespace>();
          for (const Value& p : a.positional) {
            if (!p.is_object()) return Invalid("namespace() takes keyword arguments or a dict");
            for (const auto& [k, v] : p.as_object().items) ns->attrs.Set(k, v);
          }
          for (const auto& [k, v] : a.keyword) ns->attrs.Set(k, v);
          return Value(std::move(ns));
        }));
  g.Set("dict", MakeFunction("dict", [](const Args& a) -> absl::StatusOr<Value> {
          Object o;
          for (const auto& [k, v] : a.keyword) o.Set(k, v);
          return Value(std::move(o));
        }));
  g.Set("raise_exception", MakeFunction("raise_exception", [](const Args& a) -> absl::StatusOr<Value> {
          return absl::InvalidArgumentError(a.positional.empty() ? "raise_exception" : a.positional[0].Str());
        }));
  g.Set("range", MakeFunction("range", [](const Args& a) -> absl::StatusOr<Value> {
          if (a.positional.empty() || a.positional.size() > 3) return Invalid("range expected 1 to 3 arguments");
          for (const Value& p : a.positional) {
            if (!p.is_int() && !p.is_bool()) return Invalid(absl::StrCat("'", p.TypeName(), "' object cannot be interpreted as an integer"));
          }
          const int64_t start = a.positional.size() > 1 ? a.positional[0].as_int() : 0;
          const int64_t stop = a.positional.size() > 1 ? a.positional[1].as_int() : a.positional[0].as_int();
          const int64_t step = a.positional.size() > 2 ? a.positional[2].as_int() : 1;
          if (step == 0) return Invalid("range() arg 3 must not be zero");
          Array out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 100000) return Invalid("range too large (the sandbox allows 100000 items)");
            out.push_back(Value(i));
          }
          return Value(std::move(out));
        }));
  const std::optional<int64_t> now = options.now_unix;
  g.Set("strftime_now", MakeFunction("strftime_now", [now](const Args& a) -> absl::StatusOr<Value> {
          if (a.positional.empty() || !a.positional[0].is_string()) return Invalid("strftime_now expects a format string");
          const std::time_t t = now ? static_cast<std::time_t>(*now) : std::time(nullptr);
          std::tm tm{};
          gmtime_r(&t, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof(buf), a.positional[0].as_string().c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  return g;
}

}  // namespace tailserve::jinja
