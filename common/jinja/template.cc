#include "common/jinja/template.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jinja/builtins.h"
#include "common/jinja/parser.h"
#include "common/jinja/value.h"

namespace tailserve::jinja {
namespace {

constexpr size_t kMaxValueSize = size_t{1} << 24;  // bytes of a string or the output, items of a list (RenderOptions)

// Python's numeric operators on ints (overflow refused: Python's are unbounded) and floats.
absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_float() || b.is_float() || op == "/") {
    const double x = a.as_double(), y = b.as_double();
    if ((op == "/" || op == "//" || op == "%") && y == 0) return absl::InvalidArgumentError("division by zero");
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "/") return Value(x / y);
    if (op == "//") return Value(std::floor(x / y));
    if (op == "%") {
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    return Value(std::pow(x, y));
  }
  const int64_t x = a.as_int(), y = b.as_int();
  int64_t r = 0;
  if (op == "+") {
    if (!__builtin_add_overflow(x, y, &r)) return Value(r);
  } else if (op == "-") {
    if (!__builtin_sub_overflow(x, y, &r)) return Value(r);
  } else if (op == "*") {
    if (!__builtin_mul_overflow(x, y, &r)) return Value(r);
  } else if (op == "//" || op == "%") {
    if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) return absl::InvalidArgumentError("integer overflow");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // Python floors
    return Value(op == "//" ? q : m);
  } else if (op == "**") {
    if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    r = 1;
    for (int64_t k = 0; k < y; ++k) {
      if (__builtin_mul_overflow(r, x, &r)) return absl::InvalidArgumentError("integer overflow");
      if (r == 0 || r == 1) break;
    }
    return Value(r);
  }
  return absl::InvalidArgumentError("integer overflow");
}

class Renderer {
 public:
  explicit Renderer(const RenderOptions& options) : max_steps_(options.max_steps) {
    scopes_.emplace_back();
    for (auto& [k, v] : Globals(options).items) scopes_.back()[k] = std::move(v);
  }

  absl::Status Run(const Body& body, const nlohmann::ordered_json& context, std::string* out) {
    scopes_.emplace_back();
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) scopes_.back()[k] = Value::FromJson(v);
    }
    scopes_.emplace_back();  // the template's own top-level sets
    return Exec(body, out);
  }

 private:
  static absl::Status Error(int line, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
  }
  static absl::Status AtLine(int line, const absl::Status& s) {
    if (s.ok() || absl::StartsWith(s.message(), "chat template line ")) return s;
    return Error(line, s.message());
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (auto f = it->find(name); f != it->end()) return f->second;
    }
    return Undefined{name};
  }

  absl::Status Bind(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return absl::OkStatus();
    }
    absl::StatusOr<Array> items = Iterate(v);
    if (!items.ok()) return Error(line, items.status().message());
    if (items->size() != targets.size()) {
      return Error(line, items->size() > targets.size()
                             ? absl::StrCat("too many values to unpack (expected ", targets.size(), ")")
                             : absl::StrCat("not enough values to unpack (expected ", targets.size(), ", got ",
                                            items->size(), ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = (*items)[i];
    return absl::OkStatus();
  }

  absl::Status Exec(const Body& body, std::string* out) {
    for (const StmtPtr& s : body) {
      // A render budget: a template (the model's, or a hostile one) cannot loop or grow its
      // output without bound (nested range() loops, a string doubled in a loop).
      if (++steps_ > max_steps_) return Error(s->line, absl::StrCat("the template ran past ", max_steps_, " steps"));
      if (absl::Status st = ExecOne(*s, out); !st.ok()) return st;
      if (out->size() > kMaxValueSize) return Error(s->line, "the output grew past 16 MiB");
      if (control_ != Control::kNone) return absl::OkStatus();  // unwinding to the loop
    }
    return absl::OkStatus();
  }

  absl::Status ExecOne(const Stmt& s, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out->append(s.text);
        return absl::OkStatus();
      case Stmt::Kind::kOutput: {
        absl::StatusOr<Value> v = Eval(*s.expr);
        if (!v.ok()) return v.status();
        out->append(v->Str());
        return absl::OkStatus();
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (cond) {
            absl::StatusOr<Value> c = Eval(*cond);
            if (!c.ok()) return c.status();
            if (!c->Truthy()) continue;
          }
          return Exec(body, out);
        }
        return absl::OkStatus();
      case Stmt::Kind::kFor: return For(s, out);
      case Stmt::Kind::kMacro: DefineMacro(s); return absl::OkStatus();
      case Stmt::Kind::kBreak: control_ = Control::kBreak; return absl::OkStatus();
      case Stmt::Kind::kContinue: control_ = Control::kContinue; return absl::OkStatus();
      case Stmt::Kind::kSet: {
        absl::StatusOr<Value> v = Eval(*s.expr);
        if (!v.ok()) return v.status();
        if (!s.attr.empty()) {
          const Value ns = Lookup(s.targets[0]);
          if (!ns.is_namespace()) return Error(s.line, "cannot assign attribute on non-namespace object");
          ns.as_namespace().attrs.Set(s.attr, *std::move(v));
          return absl::OkStatus();
        }
        return Bind(s.targets, *v, s.line);
      }
    }
    return absl::OkStatus();
  }

  // A macro is a callable rendering its body with its parameters bound in a scope of its own; it
  // returns the text (jinja2 returns Markup, which prints the same with autoescape off).
  void DefineMacro(const Stmt& s) {
    scopes_.back()[s.text] = Value(std::make_shared<Callable>(Callable{
        s.text, [this, &s](const Args& a) -> absl::StatusOr<Value> {
          if (a.positional.size() > s.targets.size()) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro '", s.text, "' takes not more than ", s.targets.size(), " argument(s)"));
          }
          for (const auto& [k, v] : a.keyword) {
            if (std::find(s.targets.begin(), s.targets.end(), k) == s.targets.end()) {
              return absl::InvalidArgumentError(absl::StrCat("macro '", s.text, "' takes no keyword argument '", k, "'"));
            }
          }
          if (macro_depth_ >= 64) return absl::InvalidArgumentError(absl::StrCat("macro '", s.text, "': recursion too deep"));
          ++macro_depth_;
          scopes_.emplace_back();
          absl::Status st;
          for (size_t i = 0; i < s.targets.size() && st.ok(); ++i) {
            Value v = Undefined{s.targets[i]};
            if (i < a.positional.size()) {
              v = a.positional[i];
            } else if (const Value* kw = a.Keyword(s.targets[i])) {
              v = *kw;
            } else if (s.defaults[i]) {
              absl::StatusOr<Value> d = Eval(*s.defaults[i]);
              if (!d.ok()) st = d.status();
              else v = *std::move(d);
            }
            scopes_.back()[s.targets[i]] = std::move(v);
          }
          std::string text;
          if (st.ok()) st = Exec(s.body, &text);
          scopes_.pop_back();
          --macro_depth_;
          if (!st.ok()) return st;
          return Value(std::move(text));
        }}));
  }

  absl::Status For(const Stmt& s, std::string* out) {
    absl::StatusOr<Value> iterable = Eval(*s.expr);
    if (!iterable.ok()) return iterable.status();
    absl::StatusOr<Array> all = Iterate(*iterable);
    if (!all.ok()) return Error(s.line, all.status().message());
    Array items;
    if (s.filter) {
      for (const Value& item : *all) {
        scopes_.emplace_back();
        absl::Status bound = Bind(s.targets, item, s.line);
        absl::StatusOr<Value> keep = bound.ok() ? Eval(*s.filter) : absl::StatusOr<Value>(bound);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    } else {
      items = *std::move(all);
    }
    if (items.empty()) return Exec(s.else_body, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (++steps_ > max_steps_) return Error(s.line, absl::StrCat("the template ran past ", max_steps_, " steps"));
      Object loop;
      loop.items = {{"index", Value(i + 1)},
                    {"index0", Value(i)},
                    {"revindex", Value(n - i)},
                    {"revindex0", Value(n - i - 1)},
                    {"first", Value(i == 0)},
                    {"last", Value(i == n - 1)},
                    {"length", Value(n)},
                    {"depth", Value(1)},
                    {"depth0", Value(0)},
                    {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value(Undefined{"previtem"})},
                    {"nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value(Undefined{"nextitem"})}};
      loop.items.emplace_back("cycle", Value(std::make_shared<Callable>(Callable{
                                           "cycle", [i](const Args& a) -> absl::StatusOr<Value> {
                                             if (a.positional.empty()) {
                                               return absl::InvalidArgumentError("no items for cycling given");
                                             }
                                             return a.positional[static_cast<size_t>(i) % a.positional.size()];
                                           }})));
      scopes_.emplace_back();
      scopes_.back()["loop"] = Value(std::move(loop));
      absl::Status st = Bind(s.targets, items[static_cast<size_t>(i)], s.line);
      if (st.ok()) st = Exec(s.body, out);
      scopes_.pop_back();
      if (!st.ok()) return st;
      const Control c = std::exchange(control_, Control::kNone);
      if (c == Control::kBreak) break;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Args> EvalArgs(const Expr& e, size_t first, std::optional<Value> subject) {
    Args args;
    if (subject) args.positional.push_back(*std::move(subject));
    for (size_t i = first; i < e.args.size(); ++i) {
      absl::StatusOr<Value> v = Eval(*e.args[i]);
      if (!v.ok()) return v.status();
      args.positional.push_back(*std::move(v));
    }
    for (const auto& [name, expr] : e.kwargs) {
      absl::StatusOr<Value> v = Eval(*expr);
      if (!v.ok()) return v.status();
      args.keyword.emplace_back(name, *std::move(v));
    }
    return args;
  }

  static absl::Status UndefinedError(const Value& v, int line) {
    return Error(line, absl::StrCat("'", v.undefined_name(), "' is undefined"));
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    absl::StatusOr<Value> v = EvalInner(e);
    if (!v.ok()) return AtLine(e.line, v.status());
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kString: return Value(e.text);
      case K::kInteger: {
        std::string digits;
        for (char c : e.text) {
          if (c != '_') digits.push_back(c);
        }
        errno = 0;
        const long long v = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) return Error(e.line, "integer literal out of range");
        return Value(static_cast<int64_t>(v));
      }
      case K::kFloat: {
        std::string digits;
        for (char c : e.text) {
          if (c != '_') digits.push_back(c);
        }
        return Value(std::strtod(digits.c_str(), nullptr));
      }
      case K::kBool: return Value(e.text == "true" || e.text == "True");
      case K::kNone: return Value(None{});
      case K::kName: return Lookup(e.text);
      case K::kList:
      case K::kTuple: {
        Array a;
        for (const ExprPtr& x : e.args) {
          absl::StatusOr<Value> v = Eval(*x);
          if (!v.ok()) return v.status();
          a.push_back(*std::move(v));
        }
        return Value(std::move(a));
      }
      case K::kDict: {
        Object o;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          absl::StatusOr<Value> k = Eval(*e.args[i]);
          if (!k.ok()) return k.status();
          if (!k->is_string()) return Error(e.line, "dict keys must be strings");
          absl::StatusOr<Value> v = Eval(*e.args[i + 1]);
          if (!v.ok()) return v.status();
          o.Set(k->as_string(), *std::move(v));
        }
        return Value(std::move(o));
      }
      case K::kGetAttr: {
        absl::StatusOr<Value> obj = Eval(*e.args[0]);
        if (!obj.ok()) return obj.status();
        if (obj->is_undefined()) return UndefinedError(*obj, e.line);
        if (obj->is_namespace()) {
          const Value* f = obj->as_namespace().attrs.Find(e.text);
          return f ? *f : Value(Undefined{e.text});
        }
        if (std::optional<Value> m = Method(*obj, e.text)) return *m;
        if (obj->is_object()) return GetItem(*obj, Value(e.text));
        if (obj->is_array() && !e.text.empty() && std::isdigit(static_cast<unsigned char>(e.text[0]))) {
          return GetItem(*obj, Value(static_cast<int64_t>(std::strtoll(e.text.c_str(), nullptr, 10))));
        }
        return Value(Undefined{e.text});
      }
      case K::kGetItem: {
        absl::StatusOr<Value> obj = Eval(*e.args[0]);
        if (!obj.ok()) return obj.status();
        if (obj->is_undefined()) return UndefinedError(*obj, e.line);
        absl::StatusOr<Value> key = Eval(*e.args[1]);
        if (!key.ok()) return key.status();
        Value got = GetItem(*obj, *key);
        if (got.is_undefined() && key->is_string()) {
          if (std::optional<Value> m = Method(*obj, key->as_string())) return *m;
        }
        return got;
      }
      case K::kSlice: {
        absl::StatusOr<Value> obj = Eval(*e.args[0]);
        if (!obj.ok()) return obj.status();
        if (obj->is_undefined()) return UndefinedError(*obj, e.line);
        std::optional<int64_t> parts[3];
        for (int k = 0; k < 3; ++k) {
          if (!e.args[static_cast<size_t>(k) + 1]) continue;
          absl::StatusOr<Value> p = Eval(*e.args[static_cast<size_t>(k) + 1]);
          if (!p.ok()) return p.status();
          if (p->is_none()) continue;
          if (!p->is_int() && !p->is_bool()) return Error(e.line, "slice indices must be integers or None");
          parts[k] = p->as_int();
        }
        return Slice(*obj, parts[0], parts[1], parts[2]);
      }
      case K::kCall: {
        absl::StatusOr<Value> callee = Eval(*e.args[0]);
        if (!callee.ok()) return callee.status();
        if (callee->is_undefined()) return UndefinedError(*callee, e.line);
        if (!callee->is_callable()) return Error(e.line, absl::StrCat("'", callee->TypeName(), "' object is not callable"));
        absl::StatusOr<Args> args = EvalArgs(e, 1, std::nullopt);
        if (!args.ok()) return args.status();
        return callee->as_callable().fn(*args);
      }
      case K::kFilter: {
        absl::StatusOr<Value> subject = Eval(*e.args[0]);
        if (!subject.ok()) return subject.status();
        absl::StatusOr<Args> args = EvalArgs(e, 1, *std::move(subject));
        if (!args.ok()) return args.status();
        absl::StatusOr<Value> r = ApplyFilter(e.text, *args);
        if (absl::IsNotFound(r.status())) return Error(e.line, absl::StrCat("no filter named '", e.text, "'"));
        return r;
      }
      case K::kTest: {
        absl::StatusOr<Value> subject = Eval(*e.args[0]);
        if (!subject.ok()) return subject.status();
        absl::StatusOr<Args> args = EvalArgs(e, 1, *std::move(subject));
        if (!args.ok()) return args.status();
        absl::StatusOr<bool> r = ApplyTest(e.text, *args);
        if (absl::IsNotFound(r.status())) return Error(e.line, absl::StrCat("no test named '", e.text, "'"));
        if (!r.ok()) return r.status();
        return Value(*r != e.negated);
      }
      case K::kUnary: {
        absl::StatusOr<Value> v = Eval(*e.args[0]);
        if (!v.ok()) return v.status();
        if (e.text == "not") return Value(!v->Truthy());
        if (v->is_undefined()) return UndefinedError(*v, e.line);
        if (!v->is_number()) return Error(e.line, absl::StrCat("bad operand type for unary ", e.text, ": '", v->TypeName(), "'"));
        if (e.text == "+") return v->is_bool() ? Value(v->as_int()) : *v;
        if (v->is_float()) return Value(-v->as_double());
        if (v->as_int() == INT64_MIN) return Error(e.line, "integer overflow");
        return Value(-v->as_int());
      }
      case K::kBinary: return Binary(e);
      case K::kConditional: {
        absl::StatusOr<Value> c = Eval(*e.args[1]);
        if (!c.ok()) return c.status();
        if (c->Truthy()) return Eval(*e.args[0]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value(Undefined{"conditional without else"});
      }
    }
    return Error(e.line, "unknown expression");
  }

  absl::StatusOr<Value> Binary(const Expr& e) {
    const std::string& op = e.text;
    absl::StatusOr<Value> l = Eval(*e.args[0]);
    if (!l.ok()) return l.status();
    if (op == "and") return l->Truthy() ? Eval(*e.args[1]) : *l;
    if (op == "or") return l->Truthy() ? *l : Eval(*e.args[1]);
    absl::StatusOr<Value> r = Eval(*e.args[1]);
    if (!r.ok()) return r.status();
    const Value &a = *l, &b = *r;
    if (op == "==") return Value(a.Equals(b));
    if (op == "!=") return Value(!a.Equals(b));
    if (op == "~") {
      std::string joined = a.Str() + b.Str();
      if (joined.size() > kMaxValueSize) return Error(e.line, "string too large");
      return Value(std::move(joined));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (a.is_undefined()) return UndefinedError(a, e.line);
      if (b.is_undefined()) return UndefinedError(b, e.line);
      absl::StatusOr<bool> lt = op == "<" || op == ">=" ? a.Less(b) : b.Less(a);
      if (!lt.ok()) return Error(e.line, absl::StrCat("'", op, "' not supported between instances of '", a.TypeName(),
                                                      "' and '", b.TypeName(), "'"));
      return Value(op == "<" || op == ">" ? *lt : !*lt);
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) return Error(e.line, absl::StrCat("'in <string>' requires string as left operand, not ", a.TypeName()));
        found = b.as_string().find(a.as_string()) != std::string::npos;
      } else if (b.is_array()) {
        for (const Value& x : b.as_array()) found = found || x.Equals(a);
      } else if (b.is_object()) {
        found = a.is_string() && b.as_object().Find(a.as_string()) != nullptr;
      } else if (b.is_undefined()) {
        return UndefinedError(b, e.line);
      } else {
        return Error(e.line, absl::StrCat("argument of type '", b.TypeName(), "' is not iterable"));
      }
      return Value(found != (op == "not in"));
    }
    if (a.is_undefined()) return UndefinedError(a, e.line);
    if (b.is_undefined()) return UndefinedError(b, e.line);
    if (op == "+" && a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > kMaxValueSize) return Error(e.line, "string too large");
      return Value(a.as_string() + b.as_string());
    }
    if (op == "+" && a.is_array() && b.is_array()) {
      if (a.as_array().size() + b.as_array().size() > kMaxValueSize) return Error(e.line, "list too large");
      Array c = a.as_array();
      c.insert(c.end(), b.as_array().begin(), b.as_array().end());
      return Value(std::move(c));
    }
    if (op == "*" && ((a.is_string() || a.is_array()) && (b.is_int() || b.is_bool()))) {
      const int64_t n = std::max<int64_t>(0, b.as_int());
      const int64_t size = static_cast<int64_t>(a.is_string() ? a.as_string().size() : a.as_array().size());
      if (size > 0 && n > static_cast<int64_t>(kMaxValueSize) / size) {  // divided, not multiplied: n may be near 2^63
        return Error(e.line, "repetition too large");
      }
      if (a.is_string()) {
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += a.as_string();
        return Value(std::move(s));
      }
      Array c;
      for (int64_t k = 0; k < n; ++k) c.insert(c.end(), a.as_array().begin(), a.as_array().end());
      return Value(std::move(c));
    }
    if (a.is_number() && b.is_number()) {
      absl::StatusOr<Value> v = Arithmetic(op, a, b);
      if (!v.ok()) return Error(e.line, v.status().message());
      return v;
    }
    return Error(e.line, absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(), "' and '",
                                      b.TypeName(), "'"));
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  enum class Control { kNone, kBreak, kContinue };
  Control control_ = Control::kNone;
  const int64_t max_steps_;
  int64_t steps_ = 0;
  int macro_depth_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  absl::StatusOr<Body> body = jinja::Parse(source);
  if (!body.ok()) return body.status();
  return Template(std::make_shared<const Body>(*std::move(body)));
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  Renderer r(options);
  std::string out;
  if (absl::Status s = r.Run(*body_, context, &out); !s.ok()) return s;
  return out;
}

}  // namespace tailserve::jinja
