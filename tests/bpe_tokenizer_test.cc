#include "common/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/jinja/unicode.h"
#include "tests/test_paths.h"

namespace tailserve {
namespace {

std::string TokenizerJson(const std::string& name) {
  return ::tailserve::testing::TokenizerDir(name) + "/tokenizer.json";
}

std::string IdList(const std::vector<int32_t>& ids) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
  out << "]";
  return out.str();
}

// Loads each tokenizer once for the whole suite; a missing file leaves it null (tests skip).
class BpeTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* name : {"llama3", "qwen3"}) {
      if (!std::filesystem::exists(TokenizerJson(name))) continue;
      absl::StatusOr<std::unique_ptr<BpeTokenizer>> loaded =
          BpeTokenizer::Load(TokenizerJson(name));
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      (std::string(name) == "llama3" ? llama3_ : qwen3_) = *std::move(loaded);
    }
  }
  static void TearDownTestSuite() {
    llama3_.reset();
    qwen3_.reset();
  }

  static std::unique_ptr<BpeTokenizer> llama3_;
  static std::unique_ptr<BpeTokenizer> qwen3_;
};

std::unique_ptr<BpeTokenizer> BpeTokenizerTest::llama3_;
std::unique_ptr<BpeTokenizer> BpeTokenizerTest::qwen3_;

#define REQUIRE_TOKENIZER(tok) \
  if (!(tok)) GTEST_SKIP() << "tokenizer file missing (run scripts/fetch-tokenizers.sh)"

// Every case of a HF reference output (`path`: {"cases": [{"text", "ids", "decoded"}]}): same ids,
// same decode, and a lossless round trip.
// *with_prompt_ids: how many cases also held HuggingFace's ids with add_special_tokens=True.
void ExpectMatchesReferenceFile(const BpeTokenizer& tokenizer, const std::string& name, const std::string& path,
                                size_t* with_prompt_ids = nullptr) {
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  const nlohmann::json reference = nlohmann::json::parse(in);
  const nlohmann::json& cases = reference.at("cases");
  ASSERT_FALSE(cases.empty());
  size_t passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i].at("text").get<std::string>();
    const std::vector<int32_t> expected = cases[i].at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> actual = tokenizer.Encode(text);
    const bool ids_ok = actual == expected;
    const bool decode_ok = tokenizer.Decode(expected) == cases[i].at("decoded").get<std::string>();
    const bool round_trip_ok = tokenizer.Decode(actual) == text;
    EXPECT_TRUE(ids_ok) << name << " case " << i << " text: " << nlohmann::json(text).dump()
                        << "\n  expected " << IdList(expected) << "\n  actual   " << IdList(actual);
    EXPECT_TRUE(decode_ok) << name << " case " << i << ": Decode(ids) != decoded";
    EXPECT_TRUE(round_trip_ok) << name << " case " << i << ": Decode(Encode(text)) != text";
    // With add_special_tokens=True (what a text prompt gets), where the reference has it.
    if (cases[i].contains("prompt_ids")) {
      EXPECT_EQ(tokenizer.EncodePrompt(text), cases[i]["prompt_ids"].get<std::vector<int32_t>>()) << name << " case " << i;
      if (with_prompt_ids) ++*with_prompt_ids;
    }
    passed += ids_ok && decode_ok && round_trip_ok;
  }
  EXPECT_EQ(passed, cases.size()) << name;
}

void ExpectMatchesReference(const BpeTokenizer& tokenizer, const std::string& name) {
  ExpectMatchesReferenceFile(tokenizer, name,
                             ::tailserve::testing::SharedDir() + "/reference/tokenizer/tokenizer-" + name + "-visible.json");
}

TEST_F(BpeTokenizerTest, Llama3MatchesHuggingFaceReference) {
  TAILSERVE_REQUIRE_SHARED();
  REQUIRE_TOKENIZER(llama3_);
  ExpectMatchesReference(*llama3_, "llama3");
}

TEST_F(BpeTokenizerTest, Qwen3MatchesHuggingFaceReference) {
  TAILSERVE_REQUIRE_SHARED();
  REQUIRE_TOKENIZER(qwen3_);
  ExpectMatchesReference(*qwen3_, "qwen3");
}

// The default model's own tokenizer (tools/lm/bpe_train.py) against HuggingFace tokenizers on its
// edge cases and held-out corpus documents (tools/lm/tokenizer_cases.py).
TEST(ShippedTokenizerTest, TinyEnMatchesHuggingFaceReference) {
  const std::string dir = ::tailserve::testing::DefaultModelDir();
  TAILSERVE_REQUIRE_CHECKPOINT("tiny-en");
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok = BpeTokenizer::Load(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  size_t with_prompt_ids = 0;
  ExpectMatchesReferenceFile(**tok, "tiny-en", dir + "/reference/tokenizer_cases.json", &with_prompt_ids);
  EXPECT_GT(with_prompt_ids, 70u) << "a text prompt gets the BOS the model was trained with, as HuggingFace adds it";
}

TEST_F(BpeTokenizerTest, Llama3AddedTokens) {
  REQUIRE_TOKENIZER(llama3_);
  const std::vector<int32_t> ids = llama3_->Encode("<|begin_of_text|>hi");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_TRUE(llama3_->IsSpecial(128000));
  EXPECT_FALSE(llama3_->IsSpecial(1));
  EXPECT_EQ(llama3_->TokenId("<|end_of_text|>"), 128001);
  EXPECT_EQ(llama3_->TokenBytes(128001), "<|end_of_text|>");
  EXPECT_EQ(llama3_->TokenId("Ġthe"), llama3_->Encode(" the").at(0));
  EXPECT_EQ(llama3_->TokenId("no such token"), std::nullopt);
  EXPECT_EQ(llama3_->vocab_size(), 128256);
  EXPECT_EQ(llama3_->TokenBytes(-1), "");
  EXPECT_EQ(llama3_->TokenBytes(llama3_->vocab_size()), "");
  // Added tokens are found mid-text too, and the text around them is encoded as usual.
  const std::vector<int32_t> mid = llama3_->Encode("a<|end_of_text|>b");
  EXPECT_EQ(mid, (std::vector<int32_t>{llama3_->Encode("a")[0], 128001, llama3_->Encode("b")[0]}));
}

TEST_F(BpeTokenizerTest, Qwen3AddedTokens) {
  REQUIRE_TOKENIZER(qwen3_);
  EXPECT_EQ(qwen3_->TokenId("<|im_start|>"), 151644);
  const std::vector<int32_t> ids = qwen3_->Encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  EXPECT_TRUE(qwen3_->IsSpecial(151644));
  // <think> is an added token but not a special one.
  EXPECT_EQ(qwen3_->Encode("<think>"), std::vector<int32_t>{151667});
  EXPECT_FALSE(qwen3_->IsSpecial(151667));
  EXPECT_EQ(qwen3_->vocab_size(), 151669);
}

TEST_F(BpeTokenizerTest, NfcNormalizationOnlyWhereConfigured) {
  REQUIRE_TOKENIZER(llama3_);
  REQUIRE_TOKENIZER(qwen3_);
  const std::string decomposed =
      "caf"
      "e\xCC\x81";                             // e + U+0301 COMBINING ACUTE ACCENT
  const std::string composed = "caf\xC3\xA9";  // U+00E9
  EXPECT_EQ(qwen3_->Encode(decomposed), qwen3_->Encode(composed));
  EXPECT_NE(llama3_->Encode(decomposed), llama3_->Encode(composed));
  EXPECT_EQ(llama3_->Decode(llama3_->Encode(decomposed)), decomposed);
}

TEST_F(BpeTokenizerTest, StreamingDecoderYieldsValidUtf8Deltas) {
  REQUIRE_TOKENIZER(llama3_);
  REQUIRE_TOKENIZER(qwen3_);
  const std::string text =
      "Hi 😀🚀 今天天气怎么样☀️？ naïve 한국어 👩‍👩‍👧 done";
  for (const BpeTokenizer* tokenizer : {llama3_.get(), qwen3_.get()}) {
    StreamingDecoder decoder(*tokenizer);
    std::string joined;
    for (const int32_t id : tokenizer->Encode(text)) {
      const std::string delta = decoder.Add(id);
      EXPECT_TRUE(IsValidUtf8(delta)) << "id " << id;
      joined += delta;
    }
    joined += decoder.Flush();
    EXPECT_EQ(joined, text);
  }
}

// Guards the O(n log n) merge: a quadratic merge would take far too long on these.
TEST_F(BpeTokenizerTest, LongWordsRoundTrip) {
  REQUIRE_TOKENIZER(llama3_);
  REQUIRE_TOKENIZER(qwen3_);
  const std::string as(20000, 'a');
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> cjk(0x4E00, 0x9FFF);
  std::string han;
  for (int i = 0; i < 5000; ++i) jinja::AppendUtf8(static_cast<char32_t>(cjk(rng)), &han);
  for (const BpeTokenizer* tokenizer : {llama3_.get(), qwen3_.get()}) {
    for (const std::string* text : {&as, static_cast<const std::string*>(&han)}) {
      const std::vector<int32_t> ids = tokenizer->Encode(*text);
      EXPECT_LT(ids.size(), text->size());
      EXPECT_EQ(tokenizer->Decode(ids), *text);
    }
  }
}

TEST_F(BpeTokenizerTest, InvalidUtf8IsEncodedByteByByte) {
  REQUIRE_TOKENIZER(llama3_);
  REQUIRE_TOKENIZER(qwen3_);
  const std::string text = std::string("ok \xFF\xFE bad \xC3 tail\xE2\x82") + '\0' + "end\xF0\x9F";
  for (const BpeTokenizer* tokenizer : {llama3_.get(), qwen3_.get()}) {
    EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(text)), text);
  }
}

TEST_F(BpeTokenizerTest, ConcurrentEncodeIsConsistent) {
  REQUIRE_TOKENIZER(qwen3_);
  const std::string text = "Concurrent encoders share one tokenizer: 共享 <|im_end|> ok. ";
  const std::vector<int32_t> expected = qwen3_->Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) mismatches[t] += qwen3_->Encode(text) != expected;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// ---- Load errors: the message names the file ----

class BpeTokenizerLoadTest : public ::testing::Test {
 protected:
  std::string WriteTemp(const std::string& name, const std::string& contents) {
    const std::string path = ::testing::TempDir() + "/bpe_tokenizer_test_" + name;
    std::ofstream(path) << contents;
    paths_.push_back(path);
    return path;
  }
  ~BpeTokenizerLoadTest() override {
    for (const std::string& path : paths_) std::filesystem::remove(path);
  }

  // A minimal valid byte-level BPE file, with `model_extra` spliced into the model object.
  static std::string MinimalJson(const std::string& model_extra) {
    return R"({"normalizer": null,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
      "decoder": {"type": "ByteLevel"},
      "added_tokens": [{"id": 3, "content": "<eos>", "special": true}],
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"])" +
           model_extra + "}}";
  }

  std::vector<std::string> paths_;
};

void ExpectErrorNaming(const absl::StatusOr<std::unique_ptr<BpeTokenizer>>& result,
                       const std::string& path, const std::string& what) {
  ASSERT_FALSE(result.ok());
  const std::string message(result.status().message());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

TEST_F(BpeTokenizerLoadTest, MinimalFileLoads) {
  const std::string path = WriteTemp("minimal.json", MinimalJson(""));
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer = BpeTokenizer::Load(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->Encode("abab<eos>ba"), (std::vector<int32_t>{2, 2, 3, 1, 0}));
  EXPECT_EQ((*tokenizer)->vocab_size(), 4);
}

TEST_F(BpeTokenizerLoadTest, MissingFile) {
  const std::string path = ::testing::TempDir() + "/bpe_tokenizer_test_does_not_exist.json";
  ExpectErrorNaming(BpeTokenizer::Load(path), path, "cannot open");
}

TEST_F(BpeTokenizerLoadTest, InvalidJson) {
  const std::string path = WriteTemp("invalid.json", "{\"model\": [1, 2,");
  ExpectErrorNaming(BpeTokenizer::Load(path), path, "invalid JSON");
}

TEST_F(BpeTokenizerLoadTest, UnsupportedModelType) {
  const std::string path =
      WriteTemp("wordpiece.json",
                R"({"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
                           "model": {"type": "WordPiece", "vocab": {}}})");
  ExpectErrorNaming(BpeTokenizer::Load(path), path, "model.type");
}

TEST_F(BpeTokenizerLoadTest, ByteFallbackRefused) {
  const std::string path = WriteTemp("fallback.json", MinimalJson(R"(, "byte_fallback": true)"));
  ExpectErrorNaming(BpeTokenizer::Load(path), path, "byte_fallback");
}

// A TemplateProcessing post-processor puts its special tokens around a prompt (EncodePrompt), as
// HuggingFace's encode with add_special_tokens=True; Encode stays without them.
TEST_F(BpeTokenizerLoadTest, TemplatePostProcessorWrapsPrompts) {
  auto with = [&](const std::string& name, const std::string& pp) {
    std::string json = MinimalJson("");
    json.insert(1, R"("post_processor": )" + pp + ", ");
    return BpeTokenizer::Load(WriteTemp(name, json));
  };
  const std::string special = R"("special_tokens": {"<eos>": {"id": "<eos>", "ids": [3], "tokens": ["<eos>"]}})";
  auto bos = with("bos.json", R"({"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<eos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], )" +
                                  special + "}]}");
  ASSERT_TRUE(bos.ok()) << bos.status();
  EXPECT_EQ((*bos)->EncodePrompt("ab"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ((*bos)->Encode("ab"), (std::vector<int32_t>{2}));
  auto around = with("around.json", R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<eos>"}},
      {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<eos>"}}], )" + special + "}");
  ASSERT_TRUE(around.ok()) << around.status();
  EXPECT_EQ((*around)->EncodePrompt("ba"), (std::vector<int32_t>{3, 1, 0, 3}));
  auto plain = BpeTokenizer::Load(WriteTemp("plain.json", MinimalJson("")));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->EncodePrompt("ab"), (std::vector<int32_t>{2})) << "no post-processor: nothing added";

  const std::pair<std::string, std::string> bad[] = {
      {R"({"type": "BertProcessing"})", "post_processor.type"},
      {R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>"}}, {"Sequence": {"id": "A"}}], )" +
           special + "}",
       "<bos>"},
      {R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<eos>"}}], )" + special + "}",
       "post_processor.single"},
      {R"({"type": "Sequence", "processors": [{"type": "TemplateProcessing", "single": 7}]})",
       "post_processor.processors[0].single"},
  };
  for (size_t i = 0; i < std::size(bad); ++i) {
    const std::string name = "badpp" + std::to_string(i) + ".json";
    std::string json = MinimalJson("");
    json.insert(1, R"("post_processor": )" + bad[i].first + ", ");
    const std::string path = WriteTemp(name, json);
    ExpectErrorNaming(BpeTokenizer::Load(path), path, bad[i].second);
  }
}

TEST_F(BpeTokenizerLoadTest, MergeOutsideVocabRefused) {
  std::string json = MinimalJson("");
  json.replace(json.find("\"a b\""), 5, "\"a c\"");
  const std::string path = WriteTemp("badmerge.json", json);
  ExpectErrorNaming(BpeTokenizer::Load(path), path, "model.merges");
}

}  // namespace
}  // namespace tailserve
