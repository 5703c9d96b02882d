#pragma once
// The Jinja lexer of chat templates, with the environment transformers renders them in:
// trim_blocks and lstrip_blocks on, one trailing newline of the template dropped
// (keep_trailing_newline off), "\r\n" read as "\n". Whitespace control follows Jinja's own lexer,
// not a regex over the source (@huggingface/jinja's, which can also touch text and string
// literals): "{%-" / "{{-" / "{#-" strip all whitespace before the tag, "-%}" / "-}}" / "-#}" all
// after it; lstrip_blocks removes the spaces and tabs before a "{%" or "{#" that begins its line
// ("{%+" keeps them); trim_blocks removes the one newline after a "%}" or "#}". Comments produce
// no tokens. Errors name the line.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tailserve::jinja {

enum class TokenKind {
  kText,         // template text, whitespace control applied
  kExprStart,    // {{
  kExprEnd,      // }}
  kBlockStart,   // {%
  kBlockEnd,     // %}
  kName,         // identifiers and keywords (if, for, in, not, and, or, is, true, none, ...)
  kString,       // a string literal, escapes decoded
  kInteger,
  kFloat,
  kOperator,     // == != <= >= // ** < > + - * / % ~ | . , : ( ) [ ] { } =
};

struct Token {
  TokenKind kind;
  std::string text;  // the text, name, decoded string, number's spelling or operator
  int line = 1;      // where it starts, 1-based
};

absl::StatusOr<std::vector<Token>> Lex(std::string_view source);

}  // namespace tailserve::jinja
