// The chat-template parser (common/jinja/parser.h): Jinja's grammar and precedence, the shipped
// models' templates, and refusals that name what is not supported.
#include "common/jinja/parser.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/test_paths.h"

namespace tailserve::jinja {
namespace {

std::string Tree(std::string_view source) {
  absl::StatusOr<Body> body = Parse(source);
  return body.ok() ? ToSExpr(*body) : "error: " + std::string(body.status().message());
}

TEST(JinjaParserTest, PrecedenceAsJinja) {
  struct Case {
    const char* source;
    const char* tree;
  };
  const Case cases[] = {
      // Filters and tests bind tighter than arithmetic; ~ tighter than + (as jinja2 parses them).
      {"{{ a + b | trim }}", "{{(+ a (| trim b))}}"},
      {"{{ a ~ b + c }}", "{{(+ (~ a b) c)}}"},
      {"{{ not x is defined }}", "{{(not (is defined x))}}"},
      {"{{ x is not none and y is string }}", "{{(and (is-not none x) (is string y))}}"},
      {"{{ a or b and not c }}", "{{(or a (and b (not c)))}}"},
      {"{{ -x | abs }}", "{{(| abs (- x))}}"},
      {"{{ a * b + c // d % e ** f }}", "{{(+ (* a b) (% (// c d) (** e f)))}}"},
      {"{{ x if c else y }}", "{{(if x c y)}}"},
      {"{{ x if c }}", "{{(if x c _)}}"},
      {"{{ a not in b or a in c }}", "{{(or (not in a b) (in a c))}}"},
      {"{{ (messages|length - 1) - loop.index0 }}", "{{(- (- (| length messages) 1) (. loop index0))}}"},
      // Postfix: attributes, items, slices, calls with keywords.
      {"{{ messages[1:] }}", "{{(slice messages 1 _ _)}}"},
      {"{{ x[::-1] }}", "{{(slice x _ _ (- 1))}}"},
      {"{{ m['content'].split('</think>')[0].rstrip('\\n') }}",
       "{{(call (. ([] (call (. ([] m \"content\") split) \"</think>\") 0) rstrip) \"\\n\")}}"},
      {"{{ x | tojson(indent=4) }}", "{{(| tojson x indent=4)}}"},
      {"{{ t | reject('equalto', 'x') | join(', ') }}", "{{(| join (| reject t \"equalto\" \"x\") \", \")}}"},
      {"{{ x is divisibleby 3 }}", "{{(is divisibleby x 3)}}"},
      // Literals.
      {"{{ 'a' \"b\" }}", "{{\"ab\"}}"},
      {"{{ {'k': v, 'j': [1, 2.5,], 'n': none, 't': True} }}", "{{{\"k\" v \"j\" [1 2.5] \"n\" none \"t\" true}}}"},
      {"{{ (1,) }}{{ () }}{{ (a) }}", "{{(tuple 1)}} {{(tuple )}} {{a}}"},
  };
  for (const Case& c : cases) EXPECT_EQ(Tree(c.source), c.tree) << c.source;
}

TEST(JinjaParserTest, Statements) {
  EXPECT_EQ(Tree("{% if a %}A{% elif b %}B{% else %}C{% endif %}"), "(if [a \"A\"] [b \"B\"] [else \"C\"])");
  EXPECT_EQ(Tree("{% for k, v in d | items if v %}{{ k }}{% else %}none{% endfor %}"),
            "(for k,v (| items d) if v [{{k}}] else [\"none\"])");
  EXPECT_EQ(Tree("{% set ns = namespace(found=false) %}{% set ns.found = true %}{% set a, b = t %}"),
            "(set ns (call namespace found=false)) (set ns.found true) (set a,b t)");
  EXPECT_EQ(Tree("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"),
            "(for m messages [(if [(== (. m role) \"user\") {{(. m content)}}])])");
}

TEST(JinjaParserTest, RefusesWhatItDoesNotSupportByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% call f() %}x{% endcall %}", "line 1: {% call %} is not supported"},
      {"{% macro f(a=1, b) %}{% endmacro %}", "line 1: a parameter without a default after one with"},
      {"a\n{% raw %}{{ x }}{% endraw %}", "line 2: {% raw %} is not supported"},
      {"{% break %}", "{% break %} outside a loop"},
      {"{% for x in y %}{% else %}{% continue %}{% endfor %}", "{% continue %} outside a loop"},
      {"{% set x %}body{% endset %}", "{% set %} without '=' (a block set) is not supported"},
      {"{% for x in y recursive %}{% endfor %}", "{% for ... recursive %} is not supported"},
      {"{% if x %}open", "missing {% endif %}"},
      {"{{ x + }}", "expected an expression"},
      {"{{ f(a=1, 2) }}", "a positional argument after a keyword argument"},
  };
  for (const auto& [source, message] : cases) {
    const std::string tree = Tree(source);
    EXPECT_NE(tree.find(message), std::string::npos) << source << " -> " << tree;
    EXPECT_EQ(tree.rfind("error: chat template line ", 0), 0u) << tree;
  }
}

// The chat templates of the tokenizers the tests use (scripts/fetch-tokenizers.sh) parse whole.
TEST(JinjaParserTest, ParsesTheShippedChatTemplates) {
  int parsed = 0;
  for (const char* name : {"llama3", "qwen3"}) {
    const std::string path = testing::TokenizerDir(name) + "/tokenizer_config.json";
    if (!std::filesystem::exists(path)) continue;
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(path));
    ASSERT_TRUE(config.contains("chat_template")) << path;
    absl::StatusOr<Body> body = Parse(config["chat_template"].get<std::string>());
    EXPECT_TRUE(body.ok()) << name << ": " << body.status();
    parsed += body.ok();
  }
  if (parsed == 0) GTEST_SKIP() << "tokenizers not fetched (scripts/fetch-tokenizers.sh)";
}

}  // namespace
}  // namespace tailserve::jinja
