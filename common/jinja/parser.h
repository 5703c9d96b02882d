#pragma once
// Parses a chat template into its syntax tree (common/jinja/ast.h) with Jinja's grammar and
// operator precedence. What chat templates use is supported: {% if/elif/else %}, {% for %} (one
// or more targets, an inline if, an else), {% set %} (a name, names, or namespace.attr), {{ }},
// literals (strings, numbers, lists, tuples, dicts, true/false/none), attribute, item and slice
// access, calls with keyword arguments, filters, tests, the conditional expression, break and
// continue (transformers enables loopcontrols), {% generation %} (rendered as its body), macros.
// Anything else (call, filter and raw blocks, include, import, extends, block set) is
// refused naming it and its line: a template is rendered exactly or not at all.
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/jinja/ast.h"

namespace tailserve::jinja {

absl::StatusOr<Body> Parse(std::string_view source);

// The tree as an S-expression, for tests and error reports.
std::string ToSExpr(const Body& body);
std::string ToSExpr(const Expr& expr);

}  // namespace tailserve::jinja
