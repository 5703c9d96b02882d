#pragma once
// The chat-template syntax tree: what common/jinja/parser.h builds from the lexer's tokens and the
// evaluator walks. Expressions and statements are tagged nodes owning their children.
#include <memory>
#include <string>
#include <vector>

namespace tailserve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kString, kInteger, kFloat, kBool, kNone,  // literals (value in `text`: the spelling)
    kName,                                     // a variable (text)
    kList, kTuple, kDict,                      // args: items (a dict alternates key, value)
    kGetAttr,                                  // args[0].text
    kGetItem,                                  // args[0][args[1]]
    kSlice,                                    // args[0][args[1]:args[2]:args[3]], null parts absent
    kCall,                                     // args[0](args[1..]; kwargs)
    kFilter,                                   // args[0] | text(args[1..]; kwargs)
    kTest,                                     // args[0] is [not] text(args[1..]); negated
    kUnary,                                    // text ("not", "-", "+") args[0]
    kBinary,                                   // args[0] text args[1] ("and", "or", "in", "not in", "~", ...)
    kConditional,                              // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  std::string text;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
  int line = 1;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches: (condition, body)...; a final else branch has a null condition
    kFor,     // for targets in iter [if filter]: body [else: else_body]
    kSet,     // set targets = expr (targets: one name, or "ns.attr" as name + attr)
    kBreak,   // {% break %} / {% continue %} (jinja2's loopcontrols, which transformers enables)
    kContinue,
    kMacro,   // macro text(targets = defaults): body
  };
  Kind kind;
  std::string text;
  ExprPtr expr;                                    // output, for's iterable, set's value
  std::vector<std::pair<ExprPtr, Body>> branches;  // if
  std::vector<std::string> targets;                // for / set names
  std::string attr;                                // set ns.attr
  ExprPtr filter;                                  // for ... if filter
  std::vector<ExprPtr> defaults;                   // macro: per parameter, its default or null
  Body body, else_body;                            // for
  int line = 1;
};

}  // namespace tailserve::jinja
