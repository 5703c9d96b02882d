// The chat-template lexer (common/jinja/lexer.h): tokens, and whitespace control as Jinja's own
// lexer applies it with transformers' settings (trim_blocks, lstrip_blocks, no trailing newline).
#include "common/jinja/lexer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tailserve::jinja {
namespace {

// Tokens as one string: text in quotes, tags as {{ }} {% %}, the rest by their text.
std::string Show(std::string_view source) {
  absl::StatusOr<std::vector<Token>> tokens = Lex(source);
  if (!tokens.ok()) return "error: " + std::string(tokens.status().message());
  std::string out;
  for (const Token& t : *tokens) {
    if (!out.empty()) out += ' ';
    switch (t.kind) {
      case TokenKind::kText: out += "\"" + t.text + "\""; break;
      case TokenKind::kExprStart: out += "{{"; break;
      case TokenKind::kExprEnd: out += "}}"; break;
      case TokenKind::kBlockStart: out += "{%"; break;
      case TokenKind::kBlockEnd: out += "%}"; break;
      case TokenKind::kString: out += "s'" + t.text + "'"; break;
      case TokenKind::kInteger: out += "i" + t.text; break;
      case TokenKind::kFloat: out += "f" + t.text; break;
      default: out += t.text;
    }
  }
  return out;
}

TEST(JinjaLexerTest, WhitespaceControlAsJinjaAppliesIt) {
  struct Case {
    const char* source;
    const char* tokens;
  };
  const Case cases[] = {
      {"Hello {{ name }}!", "\"Hello \" {{ name }} \"!\""},
      // trim_blocks: the newline right after a block or comment goes; after {{ }} it stays.
      {"{% if x %}\nA\n{% endif %}\n", "{% if x %} \"A\n\" {% endif %}"},
      {"{{ x }}\nb", "{{ x }} \"\nb\""},
      {"{# note #}\nb", "\"b\""},
      {"{% if x %}  \nb", "{% if x %} \"  \nb\""},
      // lstrip_blocks: spaces and tabs before a block tag that begins its line, not before {{.
      {"  {% if x %}y", "{% if x %} \"y\""},
      {"a  {% if x %}", "\"a  \" {% if x %}"},
      {"a\n \t {% if x %}", "\"a\n\" {% if x %}"},
      {"a\n  {{ x }}", "\"a\n  \" {{ x }}"},
      {"a\n  {%+ if x %}", "\"a\n  \" {% if x %}"},
      {"{% if x %}\n    {% if y %}", "{% if x %} {% if y %}"},
      // "-" strips every whitespace character on its side.
      {"a \n {%- if x -%} \n b", "\"a\" {% if x %} \"b\""},
      {"a {{- x -}} b", "\"a\" {{ x }} \"b\""},
      {"a {#- c -#} b", "\"a\" \"b\""},
      // One trailing newline of the template goes; \r\n reads as \n.
      {"a\n", "\"a\""},
      {"a\n\n", "\"a\n\""},
      {"a\r\n{% if x %}", "\"a\n\" {% if x %}"},
  };
  for (const Case& c : cases) EXPECT_EQ(Show(c.source), c.tokens) << c.source;
}

TEST(JinjaLexerTest, ExpressionTokens) {
  EXPECT_EQ(Show(R"({{ 'a\nb' + "c\"d" ~ 'e\'' }})"), "{{ s'a\nb' + s'c\"d' ~ s'e'' }}");
  EXPECT_EQ(Show("{{ x[::-1] == 1.5 // 2 != 10_000 }}"), "{{ x [ : : - i1 ] == f1.5 // i2 != i10000 }}");
  EXPECT_EQ(Show("{% set ns.a = namespace(k=true) %}"), "{% set ns . a = namespace ( k = true ) %}");
  EXPECT_EQ(Show("{{ m['content'] | trim | tojson(indent=4) }}"),
            "{{ m [ s'content' ] | trim | tojson ( indent = i4 ) }}");
  EXPECT_EQ(Show("{{ a <= b >= c < d > e ** f % g }}"), "{{ a <= b >= c < d > e ** f % g }}");
  // A string may hold a raw newline (Llama 3's template does).
  EXPECT_EQ(Show("{{ '<|x|>\n\n' }}"), "{{ s'<|x|>\n\n' }}");
}

TEST(JinjaLexerTest, ErrorsNameTheLine) {
  EXPECT_EQ(Show("a\n{{ x"), "error: chat template line 2: unterminated {{");
  EXPECT_EQ(Show("{% if x %}\n\n{% set y = 'abc %}"), "error: chat template line 3: unterminated string");
  EXPECT_EQ(Show("{{ x ? y }}"), "error: chat template line 1: unexpected character '?'");
  EXPECT_EQ(Show("a {# never closed"), "error: chat template line 1: unterminated comment");
}

}  // namespace
}  // namespace tailserve::jinja
