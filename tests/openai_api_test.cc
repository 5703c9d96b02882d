// The OpenAI API's JSON translation (router/http/openai_api.h): requests to GenerateRequest, the
// errors each bad field gets (status, param, message), and the exact response and chunk shapes.
#include "router/http/openai_api.h"

#include <gtest/gtest.h>

#include <tuple>

namespace tailserve::http {
namespace {

using Json = nlohmann::ordered_json;

class OpenAiApiTest : public ::testing::Test {
 protected:
  OpenAiApiTest() {
    tmpl_ = *jinja::Template::Parse(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if tools %}(tools:{{ tools | length }}){% endif %}{% if add_generation_prompt %}[assistant]{% endif %}"
        "{% if enable_thinking is defined %}think={{ enable_thinking }}{% endif %}");
    model_.name = "m";
    model_.chat_template = &*tmpl_;
    model_.special_tokens = {{"bos_token", "<s>"}};
    model_.max_tokens_limit = 100;
  }
  absl::StatusOr<ApiRequest> Parse(const Json& body, bool chat, ApiError* e = nullptr) {
    ApiError ignored;
    return ParseRequest(body.dump(), chat, model_, e ? e : &ignored);
  }
  std::optional<jinja::Template> tmpl_;
  ModelInfo model_;
};

TEST_F(OpenAiApiTest, CompletionFields) {
  auto r = Parse({{"model", "m"}, {"prompt", "hi"}, {"max_tokens", 7}, {"temperature", 0.5}, {"top_p", 0.9},
                  {"seed", 42}, {"stop", "\n"}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
                  {"priority", "interactive"}, {"ttft_slo_ms", 300}, {"session_id", "s1"}, {"top_k", 5}, {"user", "u"}},
                 false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  const v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(g.prompt(), "hi");
  EXPECT_EQ(g.max_tokens(), 7);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 5);
  EXPECT_EQ(g.sampling().seed(), 42u);
  ASSERT_EQ(g.stop_size(), 1);
  EXPECT_EQ(g.stop(0), "\n");
  EXPECT_EQ(g.priority(), v1::PRIORITY_INTERACTIVE);
  EXPECT_EQ(g.ttft_slo_ms(), 300);
  EXPECT_EQ(g.session_id(), "s1");
}

TEST_F(OpenAiApiTest, DefaultsAndPromptForms) {
  auto r = Parse({{"model", "m"}, {"prompt", {1, 2, 3}}}, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generate.prompt_token_ids_size(), 3);
  EXPECT_EQ(r->generate.max_tokens(), 16);  // OpenAI's completion default
  EXPECT_FLOAT_EQ(r->generate.sampling().temperature(), 1.0f);
  r = Parse({{"model", "m"}, {"prompt", {"only"}}, {"max_completion_tokens", 9}}, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generate.prompt(), "only");
  EXPECT_EQ(r->generate.max_tokens(), 9);
}

TEST_F(OpenAiApiTest, ChatRendersTheTemplate) {
  auto r = Parse({{"model", "m"},
                  {"messages", {{{"role", "system"}, {"content", "S"}},
                                {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
                  {"tools", {{{"type", "function"}}}},
                  {"chat_template_kwargs", {{"enable_thinking", false}}}},
                 true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.prompt(), "<s>[system]S[user]ab(tools:1)[assistant]think=False");
  EXPECT_EQ(r->generate.max_tokens(), 100);  // chat's default: the router's limit
}

TEST_F(OpenAiApiTest, BadFieldsAreNamed) {
  struct Case {
    Json body;
    bool chat;
    int status;
    const char* param;
    const char* message;
  };
  const Json user = {{{"role", "user"}, {"content", "x"}}};
  for (const Case& c : std::vector<Case>{
           {{{"prompt", "x"}}, false, 400, "model", "model: a string is required"},
           {{{"model", "other"}, {"prompt", "x"}}, false, 404, "model", "The model 'other' does not exist; this server serves 'm'"},
           {{{"model", "m"}}, false, 400, "prompt", "prompt: required"},
           {{{"model", "m"}, {"prompt", {"a", "b"}}}, false, 400, "prompt", "prompt: one prompt per request is supported"},
           {{{"model", "m"}, {"prompt", "x"}, {"n", 2}}, false, 400, "n", "n: only 1 choice per request is supported"},
           {{{"model", "m"}, {"prompt", "x"}, {"temperature", 3}}, false, 400, "temperature", "temperature: must be in [0, 2], got 3"},
           {{{"model", "m"}, {"prompt", "x"}, {"max_tokens", 0}}, false, 400, "max_tokens", "max_tokens: must be in [1, 2147483647], got 0"},
           {{{"model", "m"}, {"prompt", "x"}, {"max_tokens", "9"}}, false, 400, "max_tokens", "max_tokens: must be an integer"},
           {{{"model", "m"}, {"prompt", "x"}, {"stop", 5}}, false, 400, "stop", "stop: must be a string or an array of strings"},
           {{{"model", "m"}, {"prompt", "x"}, {"logprobs", 21}}, false, 400, "logprobs", "logprobs: must be in [0, 20], got 21"},
           {{{"model", "m"}, {"prompt", "x"}, {"logprobs", true}}, false, 400, "logprobs", "logprobs: must be an integer"},
           {{{"model", "m"}, {"messages", user}, {"logprobs", 2}}, true, 400, "logprobs", "logprobs: must be a boolean"},
           {{{"model", "m"}, {"messages", user}, {"top_logprobs", 2}}, true, 400, "top_logprobs", "top_logprobs: needs logprobs set to true"},
           {{{"model", "m"}, {"messages", user}, {"logprobs", true}, {"top_logprobs", 21}}, true, 400, "top_logprobs", "top_logprobs: must be in [0, 20], got 21"},
           {{{"model", "m"}, {"prompt", "x"}, {"priority", "vip"}}, false, 400, "priority", "priority: one of interactive, standard, batch"},
           {{{"model", "m"}, {"prompt", "x"}, {"presence_penalty", 0.5}}, false, 400, "presence_penalty", "presence_penalty: not supported yet (only 0)"},
           {{{"model", "m"}}, true, 400, "messages", "messages: a non-empty array is required"},
           {{{"model", "m"}, {"messages", {{{"content", "x"}}}}}, true, 400, "messages[0].role", "messages[0].role: a string is required"},
           {{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", 5}}}}}, true, 400, "messages[0].content",
            "messages[0].content: a string, null, or an array of text parts"},
       }) {
    ApiError e;
    EXPECT_FALSE(Parse(c.body, c.chat, &e).ok()) << c.body;
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.message, c.message) << c.body;
  }
  ApiError e;
  EXPECT_FALSE(ParseRequest("{not json", false, model_, &e).ok());
  EXPECT_EQ(e.status, 400);
  model_.chat_template = nullptr;
  model_.chat_template_error = "no template here";
  EXPECT_FALSE(Parse({{"model", "m"}, {"messages", user}}, true, &e).ok());
  EXPECT_EQ(e.message, "messages: no template here");
}

// Nesting is bounded before anything recurses over the body (the template's values, tojson).
TEST_F(OpenAiApiTest, DeepNestingIsRefused) {
  std::string tools = "[";
  for (int i = 0; i < 100000; ++i) tools += "[";
  for (int i = 0; i < 100000; ++i) tools += "]";
  tools += "]";
  ApiError e;
  const std::string body = R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":)" + tools + "}";
  EXPECT_FALSE(ParseRequest(body, true, model_, &e).ok());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.message, "the body nests arrays and objects deeper than 64 levels");
  std::string ok_tools = "[";
  for (int i = 0; i < 30; ++i) ok_tools += "{\"a\":";
  ok_tools += "1";
  for (int i = 0; i < 30; ++i) ok_tools += "}";
  ok_tools += "]";
  EXPECT_TRUE(ParseRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":)" + ok_tools + "}", true,
                           model_, &e)
                  .ok());
}

TEST_F(OpenAiApiTest, ErrorsFromTheRequestPath) {
  ApiError e = ErrorFromStatus(absl::InvalidArgumentError("sampling.top_p: must be in [0, 1] (0 means 1), got 2"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "top_p");
  EXPECT_EQ(e.message, "top_p: must be in [0, 1] (0 means 1), got 2");
  e = ErrorFromStatus(absl::ResourceExhaustedError("workers are loaded (9 queued); retry after 2.3 s"));
  EXPECT_EQ(e.status, 429);
  EXPECT_DOUBLE_EQ(e.retry_after_s, 2.3);
  EXPECT_EQ(ErrorFromStatus(absl::UnauthenticatedError("invalid API key")).status, 401);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("no healthy worker")).status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("boom")).status, 500);
  EXPECT_EQ(ApiError::Make(400, "m", "invalid_request_error", "p").Json(),
            R"({"error":{"message":"m","type":"invalid_request_error","param":"p","code":null}})");
}

TEST_F(OpenAiApiTest, ResponseAndChunkShapes) {
  auto chat = Parse({{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}}},
                    true);
  ASSERT_TRUE(chat.ok());
  v1::Usage u;
  u.set_prompt_tokens(5), u.set_completion_tokens(2), u.set_cached_prompt_tokens(0);
  EXPECT_EQ(ChunkEvent(*chat, "c1", 10, "Hi", true, std::nullopt),
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":10,\"model\":\"m\",\"choices\":[{\"index\":0,"
            "\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n");
  EXPECT_EQ(ChunkEvent(*chat, "c1", 10, "", false, v1::FINISH_REASON_LENGTH),
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":10,\"model\":\"m\",\"choices\":[{\"index\":0,"
            "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":null}\n\n");
  EXPECT_EQ(UsageEvent(*chat, "c1", 10, u),
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":10,\"model\":\"m\",\"choices\":[],"
            "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n");
  auto cmpl = Parse({{"model", "m"}, {"prompt", "x"}}, false);
  ASSERT_TRUE(cmpl.ok());
  EXPECT_EQ(CompletionJson(*cmpl, "k", 3, "ab", v1::FINISH_REASON_STOP, u),
            "{\"id\":\"k\",\"object\":\"text_completion\",\"created\":3,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"ab\","
            "\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,"
            "\"total_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
}


TEST_F(OpenAiApiTest, LogprobsRequestFields) {
  const Json user = {{{"role", "user"}, {"content", "x"}}};
  auto chat = Parse({{"model", "m"}, {"messages", user}, {"logprobs", true}, {"top_logprobs", 3}}, true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_TRUE(chat->logprobs);
  EXPECT_TRUE(chat->generate.sampling().logprobs());
  EXPECT_EQ(chat->generate.sampling().top_logprobs(), 3);
  auto off = Parse({{"model", "m"}, {"messages", user}, {"logprobs", false}, {"top_logprobs", 0}}, true);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->logprobs);
  EXPECT_FALSE(off->generate.sampling().logprobs());
  auto cmpl = Parse({{"model", "m"}, {"prompt", "x"}, {"logprobs", 0}}, false);  // the sampled token's only
  ASSERT_TRUE(cmpl.ok());
  EXPECT_TRUE(cmpl->logprobs);
  EXPECT_TRUE(cmpl->generate.sampling().logprobs());
  EXPECT_EQ(cmpl->generate.sampling().top_logprobs(), 0);
}

// Tokens 'H' (72) and 'i' (105) of the byte tokenizer, with their alternatives, in both shapes; a
// stream's chunks carry their own tokens and the text offsets run on across them.
TEST_F(OpenAiApiTest, LogprobsShapes) {
  ByteTokenizer bytes;
  v1::GenerateResponse r;
  r.add_token_ids(72), r.add_token_ids(105);
  for (auto [lp, alt, alt_lp] : {std::tuple{-0.5f, 104, -1.5f}, std::tuple{-0.25f, 111, -2.0f}}) {
    v1::TokenLogprob* t = r.add_logprobs();
    t->set_logprob(lp);
    t->add_top_token_ids(alt), t->add_top_logprobs(alt_lp);
  }
  LogprobsBuilder chat(true, bytes);
  EXPECT_FALSE(chat.pending());
  chat.Add(r);
  EXPECT_TRUE(chat.pending());
  EXPECT_EQ(chat.Take().dump(),
            "{\"content\":[{\"token\":\"H\",\"logprob\":-0.5,\"bytes\":[72],\"top_logprobs\":[{\"token\":\"h\","
            "\"logprob\":-1.5,\"bytes\":[104]}]},{\"token\":\"i\",\"logprob\":-0.25,\"bytes\":[105],\"top_logprobs\":"
            "[{\"token\":\"o\",\"logprob\":-2.0,\"bytes\":[111]}]}],\"refusal\":null}");
  EXPECT_FALSE(chat.pending());
  LogprobsBuilder cmpl(false, bytes);
  cmpl.Add(r);
  EXPECT_EQ(cmpl.Take().dump(),
            "{\"tokens\":[\"H\",\"i\"],\"token_logprobs\":[-0.5,-0.25],\"top_logprobs\":[{\"h\":-1.5},{\"o\":-2.0}],"
            "\"text_offset\":[0,1]}");
  cmpl.Add(r);
  EXPECT_EQ(cmpl.Take()["text_offset"].dump(), "[2,3]");
  // In a chunk and a whole response, under "logprobs".
  auto req = Parse({{"model", "m"}, {"prompt", "x"}, {"logprobs", 1}}, false);
  ASSERT_TRUE(req.ok());
  cmpl.Add(r);
  const Json chunk = Json::parse(ChunkEvent(*req, "k", 3, "Hi", true, std::nullopt, cmpl.Take()).substr(6));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["tokens"].dump(), "[\"H\",\"i\"]");
  cmpl.Add(r);
  const Json whole = Json::parse(CompletionJson(*req, "k", 3, "Hi", v1::FINISH_REASON_LENGTH, {}, cmpl.Take()));
  EXPECT_EQ(whole["choices"][0]["logprobs"]["token_logprobs"].dump(), "[-0.5,-0.25]");
}

}  // namespace
}  // namespace tailserve::http
