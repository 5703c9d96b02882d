#include "router/validate.h"

#include <gtest/gtest.h>

#include "router/model_tokenizer.h"
#include "tests/test_paths.h"

namespace tailserve {
namespace {

class ValidateTest : public ::testing::Test {
 protected:
  ValidateTest() {
    limits_.max_tokens_limit = 100;
    limits_.max_prompt_tokens = 10;
    req_.set_prompt("hello");
    req_.set_max_tokens(5);
  }
  absl::Status Check() { return ValidateRequest(req_, limits_, tok_).status(); }
  void ExpectInvalid(const std::string& message) {
    const absl::Status s = Check();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), message);
  }
  RouterConfig limits_;
  ByteTokenizer tok_;
  v1::GenerateRequest req_;
};

TEST_F(ValidateTest, AcceptsAndTokenizes) {
  auto p = ValidateRequest(req_, limits_, tok_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prompt.size(), 5u);
  EXPECT_EQ(p->priority, v1::PRIORITY_STANDARD);
  EXPECT_EQ(p->max_tokens, 5);
}

// A text prompt gets what the model's tokenizer adds around an input (the shipped model's BOS, as
// it was trained and as HuggingFace encodes); token ids are taken as sent.
TEST_F(ValidateTest, TextPromptsGetTheTokenizersBos) {
  TAILSERVE_REQUIRE_CHECKPOINT("tiny-en");
  auto tok = ModelTokenizer::Load(testing::DefaultModelDir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  limits_.max_prompt_tokens = 100;
  auto text = ValidateRequest(req_, limits_, **tok);
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_GE(text->prompt.size(), 2u);
  EXPECT_EQ(text->prompt.front(), 8190);  // <|begin_of_text|>
  EXPECT_EQ(std::vector<int32_t>(text->prompt.begin() + 1, text->prompt.end()), (*tok)->Encode("hello"));
  req_.clear_prompt();
  for (int32_t id : (*tok)->Encode("hello")) req_.add_prompt_token_ids(id);
  auto ids = ValidateRequest(req_, limits_, **tok);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->prompt, (*tok)->Encode("hello"));
}

TEST_F(ValidateTest, SessionId) {
  req_.set_session_id("chat-7");
  auto p = ValidateRequest(req_, limits_, tok_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->session_id, "chat-7");
  req_.set_session_id(std::string(257, 's'));
  ExpectInvalid("session_id: longer than 256 bytes");
}

TEST_F(ValidateTest, EmptyPrompt) {
  req_.clear_prompt();
  ExpectInvalid("prompt: must not be empty");
}

TEST_F(ValidateTest, BothPromptForms) {
  req_.add_prompt_token_ids(1);
  ExpectInvalid("prompt: set either prompt or prompt_token_ids, not both");
}

TEST_F(ValidateTest, MaxTokens) {
  req_.set_max_tokens(0);
  ExpectInvalid("max_tokens: must be > 0, got 0");
  req_.set_max_tokens(-3);
  ExpectInvalid("max_tokens: must be > 0, got -3");
  req_.set_max_tokens(101);
  ExpectInvalid("max_tokens: 101 exceeds the limit of 100");
  req_.set_max_tokens(100);
  EXPECT_TRUE(Check().ok());
}

TEST_F(ValidateTest, OversizedPrompt) {
  req_.set_prompt("01234567890");
  ExpectInvalid("prompt: 11 tokens exceeds the limit of 10");
}

TEST_F(ValidateTest, TokenIdsOutOfVocabulary) {
  req_.clear_prompt();
  req_.add_prompt_token_ids(3);
  req_.add_prompt_token_ids(256);
  ExpectInvalid("prompt_token_ids[1]: token id 256 outside the vocabulary [0, 256)");
  req_.set_prompt_token_ids(1, -1);
  ExpectInvalid("prompt_token_ids[1]: token id -1 outside the vocabulary [0, 256)");
}

TEST_F(ValidateTest, UnknownPriority) {
  req_.set_priority(static_cast<v1::Priority>(42));
  ExpectInvalid("priority: unknown value 42");
  req_.set_priority(v1::PRIORITY_INTERACTIVE);
  EXPECT_TRUE(Check().ok());
}

TEST_F(ValidateTest, SloObjectives) {
  req_.set_ttft_slo_ms(-5);
  ExpectInvalid("ttft_slo_ms: must be >= 0, got -5");
  req_.set_ttft_slo_ms(300);
  req_.set_tpot_slo_ms(-1);
  ExpectInvalid("tpot_slo_ms: must be >= 0, got -1");
  req_.set_tpot_slo_ms(40);
  auto p = ValidateRequest(req_, limits_, tok_);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ttft_slo_ms, 300);
  EXPECT_EQ(p->tpot_slo_ms, 40);
}

TEST_F(ValidateTest, Sampling) {
  req_.mutable_sampling()->set_temperature(-1);
  ExpectInvalid("sampling.temperature: must be in [0, 100], got -1");
  req_.mutable_sampling()->set_temperature(0.7f);
  req_.mutable_sampling()->set_top_p(1.5f);
  ExpectInvalid("sampling.top_p: must be in [0, 1] (0 means 1), got 1.5");
  req_.mutable_sampling()->set_top_p(0.9f);
  req_.mutable_sampling()->set_top_k(-2);
  ExpectInvalid("sampling.top_k: must be >= 0, got -2");
}

TEST_F(ValidateTest, StopStringsAndIds) {
  req_.add_stop("");
  ExpectInvalid("stop[0]: must be 1..256 bytes");
  req_.clear_stop();
  for (int i = 0; i < kMaxStopStrings + 1; ++i) req_.add_stop("x");
  ExpectInvalid("stop: 17 stop strings; at most 16");
  req_.clear_stop();
  req_.add_stop_token_ids(999);
  ExpectInvalid("stop_token_ids[0]: token id 999 outside the vocabulary");
}

TEST_F(ValidateTest, RequestIdLength) {
  req_.set_request_id(std::string(kMaxRequestIdBytes + 1, 'x'));
  ExpectInvalid("request_id: longer than 256 bytes");
}

}  // namespace
}  // namespace tailserve
