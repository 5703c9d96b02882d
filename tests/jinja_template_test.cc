// The chat-template renderer's contract at its boundary (common/jinja/template.h): errors are
// INVALID_ARGUMENT naming the template line, raise_exception's message reaches the caller, and a
// failed render returns nothing partial. Byte-exactness against Python's jinja2 is
// tests/jinja_differential.py's job.
#include <gtest/gtest.h>

#include "common/jinja/template.h"

namespace tailserve::jinja {
namespace {

absl::StatusOr<std::string> Render(std::string_view source, const nlohmann::ordered_json& context) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(context);
}

TEST(JinjaTemplateTest, RendersAChatConversation) {
  const char* source =
      "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m.content | trim }}\n{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}";
  const nlohmann::ordered_json ctx = {{"bos_token", "<s>"},
                                      {"add_generation_prompt", true},
                                      {"messages", {{{"role", "system"}, {"content", " Be brief. "}},
                                                    {{"role", "user"}, {"content", "Hi"}}}}};
  absl::StatusOr<std::string> r = Render(source, ctx);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "<s><|system|>Be brief.\n<|user|>Hi\n<|assistant|>");
}

TEST(JinjaTemplateTest, RaiseExceptionCarriesItsMessage) {
  absl::StatusOr<std::string> r =
      Render("ok so far{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}",
             {{"messages", {{{"role", "assistant"}}}}});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "chat template line 1: Conversation roles must alternate");
}

TEST(JinjaTemplateTest, ErrorsNameTheLine) {
  struct Case {
    const char* source;
    const char* message;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"line one\n{{ messages.x.y }}", "chat template line 2: 'x' is undefined"},
           {"\n\n{{ 'a' + 1 }}", "chat template line 3: unsupported operand type(s) for +: 'str' and 'int'"},
           {"{{ 1 | nosuch }}", "chat template line 1: no filter named 'nosuch'"},
           {"{{ 1 is nosuch }}", "chat template line 1: no test named 'nosuch'"},
           {"{% for x in 3 %}{% endfor %}", "chat template line 1: 'int' object is not iterable"},
           {"{% set x = 1 %}{% set x.y = 2 %}", "chat template line 1: cannot assign attribute on non-namespace object"},
           {"{{ 7 // 0 }}", "chat template line 1: integer division or modulo by zero"},
           {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", "chat template line 1: too many values to unpack (expected 2)"},
           {"{{ range(1000000) | length }}", "chat template line 1: range too large (the sandbox allows 100000 items)"},
           {"{% if x %}", "chat template line 1: missing {% endif %}"},
       }) {
    absl::StatusOr<std::string> r = Render(c.source, {{"messages", nlohmann::ordered_json::object()}});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_EQ(r.status().message(), c.message) << c.source;
  }
}

TEST(JinjaTemplateTest, LoopControlsAndNamespaces) {
  absl::StatusOr<std::string> r = Render(
      "{% set ns = namespace(last=none) %}{% for m in messages %}{% if m == 'skip' %}{% continue %}{% endif %}"
      "{% if m == 'stop' %}{% break %}{% endif %}{% set ns.last = m %}{{ m }},{% endfor %}{{ ns.last }}",
      {{"messages", {"a", "skip", "b", "stop", "c"}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "a,b,b");
}

// The render budget: a hostile template cannot loop or grow without bound (inputs the fuzzer's
// class of bugs: nested loops with empty bodies, a string doubled in a loop, a repetition count
// whose product with the length overflows).
TEST(JinjaTemplateTest, RenderBudgetStopsRunawayTemplates) {
  const absl::StatusOr<std::string> loops =
      Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {});
  ASSERT_FALSE(loops.ok());
  EXPECT_EQ(loops.status().message(), "chat template line 1: the template ran past 1000000 steps");
  const absl::StatusOr<std::string> doubling = Render(
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}", {});
  ASSERT_FALSE(doubling.ok());
  EXPECT_EQ(doubling.status().message(), "chat template line 1: string too large");
  const absl::StatusOr<std::string> lists = Render(
      "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", {});
  ASSERT_FALSE(lists.ok());
  EXPECT_EQ(lists.status().message(), "chat template line 1: list too large");
  const absl::StatusOr<std::string> repeat = Render("{{ 'ab' * 4611686018427387904 }}", {});
  ASSERT_FALSE(repeat.ok());
  EXPECT_EQ(repeat.status().message(), "chat template line 1: repetition too large");
  const absl::StatusOr<std::string> output = Render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", {});
  ASSERT_FALSE(output.ok());
  EXPECT_EQ(output.status().message(), "chat template line 1: the output grew past 16 MiB");
  // A real conversation stays far inside it.
  EXPECT_TRUE(Render("{% for i in range(2000) %}[{{ i }}]{% endfor %}", {}).ok());
}

TEST(JinjaTemplateTest, StrftimeNowUsesTheGivenClock) {
  absl::StatusOr<Template> t = Template::Parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> r = t->Render({}, {.now_unix = 1733600000});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "07 Dec 2024");
}

TEST(JinjaTemplateTest, ContextValuesKeepTheirTypesAndOrder) {
  absl::StatusOr<std::string> r =
      Render("{{ x | tojson }} {{ x.f }} {{ x.i }} {{ x }}", {{"x", {{"z", 1}, {"f", 2.0}, {"i", 3}, {"a", nullptr}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "{\"z\": 1, \"f\": 2.0, \"i\": 3, \"a\": null} 2.0 3 {'z': 1, 'f': 2.0, 'i': 3, 'a': None}");
}

}  // namespace
}  // namespace tailserve::jinja
