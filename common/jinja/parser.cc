#include "common/jinja/parser.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jinja/lexer.h"

namespace tailserve::jinja {
namespace {

using K = TokenKind;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<Body> Template() {
    Body body;
    std::string end;
    if (absl::Status s = Statements(&body, {}, &end); !s.ok()) return s;
    return body;
  }

 private:
  // ---- statements ----

  // Statements until a block tag whose keyword is in `ends` (its name in *end, the tag's
  // "{% name" consumed) or the end of the template (only when `ends` is empty).
  absl::Status Statements(Body* body, std::vector<std::string_view> ends, std::string* end) {
    while (i_ < t_.size()) {
      const Token& tok = t_[i_];
      if (tok.kind == K::kText) {
        body->push_back(Node(Stmt::Kind::kText, tok.line));
        body->back()->text = tok.text;
        ++i_;
      } else if (tok.kind == K::kExprStart) {
        ++i_;
        auto stmt = Node(Stmt::Kind::kOutput, tok.line);
        if (absl::Status s = Expression(&stmt->expr); !s.ok()) return s;
        if (absl::Status s = Expect(K::kExprEnd, "}}"); !s.ok()) return s;
        body->push_back(std::move(stmt));
      } else if (tok.kind == K::kBlockStart) {
        ++i_;
        if (i_ >= t_.size() || t_[i_].kind != K::kName) return Error("expected a statement after {%");
        const std::string keyword = t_[i_].text;
        if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
          ++i_;
          *end = keyword;
          return absl::OkStatus();
        }
        ++i_;
        if (keyword == "break" || keyword == "continue") {
          if (loops_ == 0) return Error(absl::StrCat("{% ", keyword, " %} outside a loop"), tok.line);
          body->push_back(Node(keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, tok.line));
          if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
          continue;
        }
        if (keyword == "generation") {
          // transformers' AssistantTracker marks the assistant's tokens for training masks; rendering
          // is the body as it is.
          if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
          std::string inner_end;
          if (absl::Status s = Statements(body, {"endgeneration"}, &inner_end); !s.ok()) return s;
          if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
          continue;
        }
        absl::Status s = keyword == "if"    ? If(body, tok.line)
                         : keyword == "for" ? For(body, tok.line)
                         : keyword == "set" ? Set(body, tok.line)
                         : keyword == "macro" ? Macro(body, tok.line)
                                            : Error(absl::StrCat("{% ", keyword, " %} is not supported"), tok.line);
        if (!s.ok()) return s;
      } else {
        return Error("unexpected token");
      }
    }
    if (!ends.empty()) return Error(absl::StrCat("missing {% ", std::string(ends.back()), " %}"));
    return absl::OkStatus();
  }

  absl::Status If(Body* body, int line) {
    auto stmt = Node(Stmt::Kind::kIf, line);
    std::string end = "elif";
    while (end == "elif") {
      ExprPtr cond;
      if (absl::Status s = Expression(&cond); !s.ok()) return s;
      if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
      Body branch;
      if (absl::Status s = Statements(&branch, {"elif", "else", "endif"}, &end); !s.ok()) return s;
      stmt->branches.emplace_back(std::move(cond), std::move(branch));
    }
    if (end == "else") {
      if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
      Body branch;
      if (absl::Status s = Statements(&branch, {"endif"}, &end); !s.ok()) return s;
      stmt->branches.emplace_back(nullptr, std::move(branch));
    }
    body->push_back(std::move(stmt));
    return Expect(K::kBlockEnd, "%}");
  }

  absl::Status For(Body* body, int line) {
    auto stmt = Node(Stmt::Kind::kFor, line);
    if (absl::Status s = Targets(&stmt->targets); !s.ok()) return s;
    if (!Keyword("in")) return Error("expected 'in' in {% for %}");
    // The iterable stops before an inline "if" (no conditional expression there, as in Jinja).
    if (absl::Status s = Or(&stmt->expr); !s.ok()) return s;
    if (Keyword("if")) {
      if (absl::Status s = Or(&stmt->filter); !s.ok()) return s;
    }
    if (Peek(K::kName, "recursive")) return Error("{% for ... recursive %} is not supported");
    if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
    std::string end;
    ++loops_;
    absl::Status in_body = Statements(&stmt->body, {"else", "endfor"}, &end);
    --loops_;
    if (!in_body.ok()) return in_body;
    if (end == "else") {
      if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
      if (absl::Status s = Statements(&stmt->else_body, {"endfor"}, &end); !s.ok()) return s;
    }
    body->push_back(std::move(stmt));
    return Expect(K::kBlockEnd, "%}");
  }

  absl::Status Set(Body* body, int line) {
    auto stmt = Node(Stmt::Kind::kSet, line);
    if (i_ + 2 < t_.size() && t_[i_].kind == K::kName && Peek(K::kOperator, ".", 1) && t_[i_ + 2].kind == K::kName) {
      stmt->targets.push_back(t_[i_].text);
      stmt->attr = t_[i_ + 2].text;
      i_ += 3;
    } else if (absl::Status s = Targets(&stmt->targets); !s.ok()) {
      return s;
    }
    if (!Operator("=")) return Error("{% set %} without '=' (a block set) is not supported");
    if (absl::Status s = Expression(&stmt->expr); !s.ok()) return s;
    body->push_back(std::move(stmt));
    return Expect(K::kBlockEnd, "%}");
  }

  // macro name(param, param=default, ...) body endmacro
  absl::Status Macro(Body* body, int line) {
    auto stmt = Node(Stmt::Kind::kMacro, line);
    if (i_ >= t_.size() || t_[i_].kind != K::kName) return Error("expected a macro name");
    stmt->text = t_[i_++].text;
    if (absl::Status s = Expect(K::kOperator, "("); !s.ok()) return s;
    while (!Operator(")")) {
      if (!stmt->targets.empty() && !Operator(",")) return Error("expected ',' or ')' in the macro's parameters");
      if (i_ >= t_.size() || t_[i_].kind != K::kName) return Error("expected a parameter name");
      stmt->targets.push_back(t_[i_++].text);
      stmt->defaults.emplace_back();
      if (Operator("=")) {
        if (absl::Status s = Expression(&stmt->defaults.back()); !s.ok()) return s;
      } else if (stmt->defaults.size() > 1 && stmt->defaults[stmt->defaults.size() - 2]) {
        return Error("a parameter without a default after one with");
      }
    }
    if (absl::Status s = Expect(K::kBlockEnd, "%}"); !s.ok()) return s;
    std::string end;
    const int loops = std::exchange(loops_, 0);  // break and continue do not reach out of a macro
    absl::Status in_body = Statements(&stmt->body, {"endmacro"}, &end);
    loops_ = loops;
    if (!in_body.ok()) return in_body;
    body->push_back(std::move(stmt));
    return Expect(K::kBlockEnd, "%}");
  }

  // name [, name]...
  absl::Status Targets(std::vector<std::string>* names) {
    do {
      if (i_ >= t_.size() || t_[i_].kind != K::kName) return Error("expected a name");
      names->push_back(t_[i_++].text);
    } while (Operator(","));
    return absl::OkStatus();
  }

  // ---- expressions, lowest precedence first (Jinja's parser) ----

  absl::Status Expression(ExprPtr* out) {
    if (absl::Status s = Or(out); !s.ok()) return s;
    if (Keyword("if")) {
      auto e = ExprNode(Expr::Kind::kConditional);
      e->args.push_back(std::move(*out));
      e->args.emplace_back();
      if (absl::Status s = Or(&e->args.back()); !s.ok()) return s;
      e->args.emplace_back();
      if (Keyword("else")) {
        if (absl::Status s = Expression(&e->args.back()); !s.ok()) return s;
      }
      *out = std::move(e);
    }
    return absl::OkStatus();
  }

  absl::Status Or(ExprPtr* out) { return BinaryLevel(out, {"or"}, &Parser::And); }
  absl::Status And(ExprPtr* out) { return BinaryLevel(out, {"and"}, &Parser::Not); }

  absl::Status Not(ExprPtr* out) {
    if (Peek(K::kName, "not")) {
      ++i_;
      auto e = ExprNode(Expr::Kind::kUnary);
      e->text = "not";
      e->args.emplace_back();
      if (absl::Status s = Not(&e->args.back()); !s.ok()) return s;
      *out = std::move(e);
      return absl::OkStatus();
    }
    return Compare(out);
  }

  absl::Status Compare(ExprPtr* out) {
    if (absl::Status s = Math1(out); !s.ok()) return s;
    while (true) {
      std::string op;
      if (i_ < t_.size() && t_[i_].kind == K::kOperator &&
          (t_[i_].text == "==" || t_[i_].text == "!=" || t_[i_].text == "<" || t_[i_].text == ">" ||
           t_[i_].text == "<=" || t_[i_].text == ">=")) {
        op = t_[i_++].text;
      } else if (Peek(K::kName, "in")) {
        op = "in", ++i_;
      } else if (Peek(K::kName, "not") && Peek(K::kName, "in", 1)) {
        op = "not in", i_ += 2;
      } else {
        return absl::OkStatus();
      }
      ExprPtr right;
      if (absl::Status s = Math1(&right); !s.ok()) return s;
      *out = Binary(op, std::move(*out), std::move(right));
    }
  }

  absl::Status Math1(ExprPtr* out) { return BinaryLevel(out, {"+", "-"}, &Parser::Concat); }
  absl::Status Concat(ExprPtr* out) { return BinaryLevel(out, {"~"}, &Parser::Math2); }
  absl::Status Math2(ExprPtr* out) { return BinaryLevel(out, {"*", "/", "//", "%"}, &Parser::Pow); }
  absl::Status Pow(ExprPtr* out) { return BinaryLevel(out, {"**"}, &Parser::UnaryWithFilters); }

  absl::Status UnaryWithFilters(ExprPtr* out) { return Unary(out, true); }

  absl::Status Unary(ExprPtr* out, bool with_filters) {
    if (Peek(K::kOperator, "-") || Peek(K::kOperator, "+")) {
      auto e = ExprNode(Expr::Kind::kUnary);
      e->text = t_[i_++].text;
      e->args.emplace_back();
      if (absl::Status s = Unary(&e->args.back(), false); !s.ok()) return s;
      *out = std::move(e);
    } else if (absl::Status s = Primary(out); !s.ok()) {
      return s;
    }
    if (absl::Status s = Postfix(out); !s.ok()) return s;
    return with_filters ? FiltersAndTests(out) : absl::OkStatus();
  }

  absl::Status Primary(ExprPtr* out) {
    if (i_ >= t_.size()) return Error("expected an expression");
    const Token& tok = t_[i_];
    switch (tok.kind) {
      case K::kName: {
        ++i_;
        static constexpr std::string_view kTrue[] = {"true", "True"}, kFalse[] = {"false", "False"},
                                          kNone[] = {"none", "None"};
        auto is = [&](const auto& set) { return std::find(std::begin(set), std::end(set), tok.text) != std::end(set); };
        auto e = ExprNode(is(kTrue) || is(kFalse) ? Expr::Kind::kBool : is(kNone) ? Expr::Kind::kNone : Expr::Kind::kName);
        e->text = is(kTrue) ? "true" : is(kFalse) ? "false" : tok.text;
        *out = std::move(e);
        return absl::OkStatus();
      }
      case K::kString: {
        auto e = ExprNode(Expr::Kind::kString);
        while (i_ < t_.size() && t_[i_].kind == K::kString) e->text += t_[i_++].text;  // 'a' 'b' is 'ab'
        *out = std::move(e);
        return absl::OkStatus();
      }
      case K::kInteger:
      case K::kFloat: {
        auto e = ExprNode(tok.kind == K::kInteger ? Expr::Kind::kInteger : Expr::Kind::kFloat);
        e->text = t_[i_++].text;
        *out = std::move(e);
        return absl::OkStatus();
      }
      case K::kOperator:
        if (tok.text == "(") return Parenthesised(out);
        if (tok.text == "[") return Items(out, Expr::Kind::kList, "]");
        if (tok.text == "{") return Items(out, Expr::Kind::kDict, "}");
        [[fallthrough]];
      default:
        return Error("expected an expression");
    }
  }

  // ( expr ) or a tuple: (), (a,), (a, b)
  absl::Status Parenthesised(ExprPtr* out) {
    ++i_;
    if (Operator(")")) {
      *out = ExprNode(Expr::Kind::kTuple);
      return absl::OkStatus();
    }
    ExprPtr first;
    if (absl::Status s = Expression(&first); !s.ok()) return s;
    if (Operator(")")) {
      *out = std::move(first);
      return absl::OkStatus();
    }
    auto tuple = ExprNode(Expr::Kind::kTuple);
    tuple->args.push_back(std::move(first));
    while (Operator(",")) {
      if (Operator(")")) {
        *out = std::move(tuple);
        return absl::OkStatus();
      }
      tuple->args.emplace_back();
      if (absl::Status s = Expression(&tuple->args.back()); !s.ok()) return s;
    }
    if (absl::Status s = Expect(K::kOperator, ")"); !s.ok()) return s;
    *out = std::move(tuple);
    return absl::OkStatus();
  }

  // [a, b] or {k: v, ...}, a trailing comma allowed.
  absl::Status Items(ExprPtr* out, Expr::Kind kind, std::string_view close) {
    ++i_;
    auto e = ExprNode(kind);
    while (!Operator(close)) {
      if (!e->args.empty() && !Operator(",")) return Error(absl::StrCat("expected ',' or '", std::string(close), "'"));
      if (Operator(close)) break;
      e->args.emplace_back();
      if (absl::Status s = Expression(&e->args.back()); !s.ok()) return s;
      if (kind == Expr::Kind::kDict) {
        if (absl::Status s = Expect(K::kOperator, ":"); !s.ok()) return s;
        e->args.emplace_back();
        if (absl::Status s = Expression(&e->args.back()); !s.ok()) return s;
      }
    }
    *out = std::move(e);
    return absl::OkStatus();
  }

  // .name, [index or slice], (call arguments)
  absl::Status Postfix(ExprPtr* out) {
    while (true) {
      if (Operator(".")) {
        if (i_ >= t_.size() || (t_[i_].kind != K::kName && t_[i_].kind != K::kInteger)) return Error("expected a name after '.'");
        auto e = ExprNode(Expr::Kind::kGetAttr);
        e->args.push_back(std::move(*out));
        e->text = t_[i_++].text;
        *out = std::move(e);
      } else if (Operator("[")) {
        if (absl::Status s = Subscript(out); !s.ok()) return s;
      } else if (Peek(K::kOperator, "(")) {
        auto e = ExprNode(Expr::Kind::kCall);
        e->args.push_back(std::move(*out));
        if (absl::Status s = Arguments(e.get()); !s.ok()) return s;
        *out = std::move(e);
      } else {
        return absl::OkStatus();
      }
    }
  }

  absl::Status Subscript(ExprPtr* out) {
    ExprPtr parts[3];
    int colons = 0;
    for (int k = 0; k < 3; ++k) {
      if (!Peek(K::kOperator, ":") && !Peek(K::kOperator, "]")) {
        if (absl::Status s = Expression(&parts[k]); !s.ok()) return s;
      }
      if (k < 2 && Operator(":")) {
        ++colons;
        continue;
      }
      break;
    }
    if (absl::Status s = Expect(K::kOperator, "]"); !s.ok()) return s;
    if (colons == 0) {
      if (!parts[0]) return Error("expected an index");
      *out = Binary("", std::move(*out), std::move(parts[0]));
      (*out)->kind = Expr::Kind::kGetItem;
      return absl::OkStatus();
    }
    auto e = ExprNode(Expr::Kind::kSlice);
    e->args.push_back(std::move(*out));
    for (ExprPtr& p : parts) e->args.push_back(std::move(p));
    *out = std::move(e);
    return absl::OkStatus();
  }

  // ( expr, name=expr, ... ) into e->args (after those already there) and e->kwargs.
  absl::Status Arguments(Expr* e) {
    if (absl::Status s = Expect(K::kOperator, "("); !s.ok()) return s;
    bool first = true;
    while (!Operator(")")) {
      if (!first && !Operator(",")) return Error("expected ',' or ')'");
      first = false;
      if (Operator(")")) break;
      if (i_ + 1 < t_.size() && t_[i_].kind == K::kName && Peek(K::kOperator, "=", 1)) {
        std::string name = t_[i_].text;
        i_ += 2;
        e->kwargs.emplace_back(std::move(name), nullptr);
        if (absl::Status s = Expression(&e->kwargs.back().second); !s.ok()) return s;
      } else {
        if (!e->kwargs.empty()) return Error("a positional argument after a keyword argument");
        e->args.emplace_back();
        if (absl::Status s = Expression(&e->args.back()); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // | filter(args) and is [not] test(args), left to right, as Jinja binds them (tighter than +).
  absl::Status FiltersAndTests(ExprPtr* out) {
    while (true) {
      if (Operator("|")) {
        if (i_ >= t_.size() || t_[i_].kind != K::kName) return Error("expected a filter name after '|'");
        auto e = ExprNode(Expr::Kind::kFilter);
        e->text = t_[i_++].text;
        e->args.push_back(std::move(*out));
        if (Peek(K::kOperator, "(")) {
          if (absl::Status s = Arguments(e.get()); !s.ok()) return s;
        }
        *out = std::move(e);
      } else if (Keyword("is")) {
        auto e = ExprNode(Expr::Kind::kTest);
        e->negated = Keyword("not");
        if (i_ >= t_.size() || t_[i_].kind != K::kName) return Error("expected a test name after 'is'");
        e->text = t_[i_++].text;
        e->args.push_back(std::move(*out));
        if (Peek(K::kOperator, "(")) {
          if (absl::Status s = Arguments(e.get()); !s.ok()) return s;
        } else if (i_ < t_.size() && (t_[i_].kind == K::kString || t_[i_].kind == K::kInteger ||
                                      t_[i_].kind == K::kFloat ||
                                      (t_[i_].kind == K::kName && t_[i_].text != "else" && t_[i_].text != "or" &&
                                       t_[i_].text != "and" && t_[i_].text != "if" && t_[i_].text != "not" &&
                                       t_[i_].text != "in"))) {
          // One argument without parentheses: "x is divisibleby 3", "x is sameas none".
          e->args.emplace_back();
          if (absl::Status s = Unary(&e->args.back(), false); !s.ok()) return s;
        }
        *out = std::move(e);
      } else {
        return absl::OkStatus();
      }
    }
  }

  // A left-associative level of binary operators (names like "or" or operator tokens).
  absl::Status BinaryLevel(ExprPtr* out, std::initializer_list<std::string_view> ops,
                           absl::Status (Parser::*next)(ExprPtr*)) {
    if (absl::Status s = (this->*next)(out); !s.ok()) return s;
    while (i_ < t_.size() && (t_[i_].kind == K::kOperator || t_[i_].kind == K::kName) &&
           std::find(ops.begin(), ops.end(), t_[i_].text) != ops.end()) {
      const std::string op = t_[i_++].text;
      ExprPtr right;
      if (absl::Status s = (this->*next)(&right); !s.ok()) return s;
      *out = Binary(op, std::move(*out), std::move(right));
    }
    return absl::OkStatus();
  }

  // ---- helpers ----
  int Line() const { return i_ < t_.size() ? t_[i_].line : (t_.empty() ? 1 : t_.back().line); }
  absl::Status Error(std::string_view what, int line = 0) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line ? line : Line(), ": ", std::string(what)));
  }
  bool Peek(K kind, std::string_view text, size_t ahead = 0) const {
    return i_ + ahead < t_.size() && t_[i_ + ahead].kind == kind && t_[i_ + ahead].text == text;
  }
  bool Operator(std::string_view op) { return Peek(K::kOperator, op) ? (++i_, true) : false; }
  bool Keyword(std::string_view name) { return Peek(K::kName, name) ? (++i_, true) : false; }
  absl::Status Expect(K kind, std::string_view what) {
    if (i_ < t_.size() && t_[i_].kind == kind && (kind != K::kOperator || t_[i_].text == what)) {
      ++i_;
      return absl::OkStatus();
    }
    return Error(absl::StrCat("expected '", std::string(what), "'"));
  }
  StmtPtr Node(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }
  ExprPtr ExprNode(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = Line();
    return e;
  }
  ExprPtr Binary(std::string op, ExprPtr left, ExprPtr right) {
    auto e = ExprNode(Expr::Kind::kBinary);
    e->text = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int loops_ = 0;  // for bodies being parsed: break and continue need one
};

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '\n' ? std::string("\\n") : c == '"' ? std::string("\\\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

absl::StatusOr<Body> Parse(std::string_view source) {
  absl::StatusOr<std::vector<Token>> tokens = Lex(source);
  if (!tokens.ok()) return tokens.status();
  return Parser(*std::move(tokens)).Template();
}

std::string ToSExpr(const Expr& e) {
  auto args = [&](size_t from) {
    std::vector<std::string> parts;
    for (size_t k = from; k < e.args.size(); ++k) parts.push_back(e.args[k] ? ToSExpr(*e.args[k]) : "_");
    for (const auto& [name, value] : e.kwargs) parts.push_back(name + "=" + ToSExpr(*value));
    return absl::StrJoin(parts, " ");
  };
  switch (e.kind) {
    case Expr::Kind::kString: return Quote(e.text);
    case Expr::Kind::kInteger: case Expr::Kind::kFloat: case Expr::Kind::kBool: case Expr::Kind::kName: return e.text;
    case Expr::Kind::kNone: return "none";
    case Expr::Kind::kList: return "[" + args(0) + "]";
    case Expr::Kind::kTuple: return "(tuple " + args(0) + ")";
    case Expr::Kind::kDict: return "{" + args(0) + "}";
    case Expr::Kind::kGetAttr: return "(. " + ToSExpr(*e.args[0]) + " " + e.text + ")";
    case Expr::Kind::kGetItem: return "([] " + args(0) + ")";
    case Expr::Kind::kSlice: return "(slice " + args(0) + ")";
    case Expr::Kind::kCall: return "(call " + args(0) + ")";
    case Expr::Kind::kFilter: return "(| " + e.text + " " + args(0) + ")";
    case Expr::Kind::kTest: return std::string(e.negated ? "(is-not " : "(is ") + e.text + " " + args(0) + ")";
    case Expr::Kind::kUnary: return "(" + e.text + " " + args(0) + ")";
    case Expr::Kind::kBinary: return "(" + e.text + " " + args(0) + ")";
    case Expr::Kind::kConditional: return "(if " + args(0) + ")";
  }
  return "?";
}

std::string ToSExpr(const Body& body) {
  std::vector<std::string> parts;
  for (const StmtPtr& s : body) {
    switch (s->kind) {
      case Stmt::Kind::kText: parts.push_back(Quote(s->text)); break;
      case Stmt::Kind::kOutput: parts.push_back("{{" + ToSExpr(*s->expr) + "}}"); break;
      case Stmt::Kind::kIf: {
        std::string out = "(if";
        for (const auto& [cond, branch] : s->branches) {
          out += " [" + (cond ? ToSExpr(*cond) : std::string("else")) + " " + ToSExpr(branch) + "]";
        }
        parts.push_back(out + ")");
        break;
      }
      case Stmt::Kind::kFor:
        parts.push_back("(for " + absl::StrJoin(s->targets, ",") + " " + ToSExpr(*s->expr) +
                        (s->filter ? " if " + ToSExpr(*s->filter) : "") + " [" + ToSExpr(s->body) + "]" +
                        (s->else_body.empty() ? "" : " else [" + ToSExpr(s->else_body) + "]") + ")");
        break;
      case Stmt::Kind::kMacro:
        parts.push_back("(macro " + s->text + " (" + absl::StrJoin(s->targets, ",") + ") [" + ToSExpr(s->body) + "])");
        break;
      case Stmt::Kind::kBreak: parts.push_back("(break)"); break;
      case Stmt::Kind::kContinue: parts.push_back("(continue)"); break;
      case Stmt::Kind::kSet:
        parts.push_back("(set " + absl::StrJoin(s->targets, ",") + (s->attr.empty() ? "" : "." + s->attr) + " " +
                        ToSExpr(*s->expr) + ")");
        break;
    }
  }
  return absl::StrJoin(parts, " ");
}

}  // namespace tailserve::jinja
