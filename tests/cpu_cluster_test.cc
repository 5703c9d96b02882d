// End to end on a real model: router + CPU workers serving a synthetic checkpoint (made by
// tailserve-make-checkpoint with the real Llama 3 tokenizer) answer text prompts with streamed,
// correctly decoded text; bad input is refused without disturbing other requests.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/bpe_tokenizer.h"
#include "common/subprocess.h"
#include "tailserve/v1/worker.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/generate_stream.h"
#include "tests/test_paths.h"

namespace tailserve {
namespace {

namespace fs = std::filesystem;

// Makes a checkpoint with the tool; `extra` are more flags (e.g. a short context).
std::string MakeCheckpoint(const std::string& dir, std::vector<std::string> extra = {}) {
  Subprocess p;
  std::vector<std::string> argv = {std::string(TAILSERVE_BIN_DIR) + "/tailserve-make-checkpoint", "--out", dir,
                                   "--preset", "tiny", "--layers", "2", "--seed", "11",
                                   "--tokenizer", testing::TokenizerDir("llama3")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  EXPECT_TRUE(p.Start(argv, dir + ".log").ok());
  absl::StatusOr<int> rc = p.Wait(std::chrono::seconds(120));
  EXPECT_TRUE(rc.ok() && *rc == 0) << "tailserve-make-checkpoint failed; see " << dir << ".log";
  return dir;
}

class CpuClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tailserve-ckpt-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    model_ = MakeCheckpoint(root_ + "/tiny");
    short_model_ = MakeCheckpoint(root_ + "/short", {"--max-position", "64"});
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static ClusterOptions Options(const std::string& model, int workers = 1) {
    return {workers, {"--backend", "cpu", "--model", model, "--slots", "8", "--set", "worker.threads=1"},
            {"--model", model, "--set", "batching.mode=fifo", "--set", "router.timeout_ms=0"}};
  }

  static inline std::string root_, model_, short_model_;
};

std::unique_ptr<v1::Generation::Stub> Stub(const std::string& target) {
  return v1::Generation::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

v1::GenerateRequest TextRequest(const std::string& prompt, int max_tokens, uint64_t seed) {
  v1::GenerateRequest r;
  r.set_prompt(prompt);
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_temperature(0.9f);
  r.mutable_sampling()->set_top_p(0.95f);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

TEST_F(CpuClusterTest, TextPromptStreamsDecodedTextAndSeedsRepeat) {
  // Without the prefix cache: a repeat that finds its prompt cached computes the rest in GEMMs of
  // other row counts, whose last-bit differences can flip a sampled near-tie (random weights have
  // many); the cache's own equality is checked in cpu_prefix_cache_test.cc.
  ClusterOptions options = Options(model_, 2);
  options.worker_args.insert(options.worker_args.end(), {"--set", "worker.prefix_caching=false"});
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = Stub(cluster.router_target());
  auto tokenizer = BpeTokenizer::Load(model_ + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  auto run = [&](uint64_t seed) {
    Stream s(stub.get(), TextRequest("Héllo wörld — 今天天气怎么样？ Tell me a story.", 24, seed));
    EXPECT_TRUE(s.Wait().ok());
    return std::make_pair(s.tokens(), s.deltas());
  };
  const auto [tokens, deltas] = run(42);
  ASSERT_FALSE(tokens.empty());
  std::string text;
  for (const std::string& d : deltas) {
    EXPECT_TRUE(IsValidUtf8(d)) << "delta splits a character";
    text += d;
  }
  // The streamed text is the decoded token ids, special tokens left out.
  std::string want_bytes;
  for (int32_t t : tokens) {
    if (!(*tokenizer)->IsSpecial(t)) want_bytes += (*tokenizer)->TokenBytes(t);
  }
  StreamingDecoder reference(**tokenizer);
  std::string want;
  for (int32_t t : tokens) want += (*tokenizer)->IsSpecial(t) ? "" : reference.Add(t);
  want += reference.Flush();
  EXPECT_EQ(text, want);
  if (IsValidUtf8(want_bytes)) {
    EXPECT_EQ(text, want_bytes);
  }

  const auto again = run(42);
  EXPECT_EQ(again.first, tokens) << "same seed, different tokens";
  const auto other = run(43);
  EXPECT_NE(other.first, tokens) << "different seeds gave the same 24 tokens";
}

TEST_F(CpuClusterTest, ResponsesAreNotMarkedSimulated) {
  Cluster cluster(Options(model_));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = Stub(cluster.router_target());
  Stream s(stub.get(), TextRequest("Hello", 4, 1));
  ASSERT_TRUE(s.Wait().ok());
  EXPECT_FALSE(s.last().simulated());
  EXPECT_EQ(s.last().usage().completion_tokens(), static_cast<int>(s.tokens().size()));
}

TEST_F(CpuClusterTest, BadInputIsRefusedAndOthersKeepBeingServed) {
  Cluster cluster(Options(short_model_));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = Stub(cluster.router_target());
  Stream running(stub.get(), TextRequest("A request that keeps going", 40, 5));
  ASSERT_TRUE(running.WaitTokens(1));

  // Unknown token id.
  v1::GenerateRequest ids;
  ids.add_prompt_token_ids(1);
  ids.add_prompt_token_ids(10'000'000);
  ids.set_max_tokens(4);
  Stream unknown(stub.get(), ids);
  grpc::Status s = unknown.Wait();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("outside the vocabulary"), std::string::npos) << s.error_message();

  // A prompt longer than the model's context (64 tokens).
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "word ";
  Stream too_long(stub.get(), TextRequest(long_prompt, 4, 1));
  s = too_long.Wait();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("exceeds the limit of 63"), std::string::npos) << s.error_message();

  // The same, sent straight to the worker: refused there too, that sequence alone (an event with
  // FINISH_STATE_INVALID saying why; the stream itself ends OK).
  auto worker = v1::Worker::NewStub(grpc::CreateChannel(cluster.worker_target(0), grpc::InsecureChannelCredentials()));
  v1::Batch batch;
  batch.set_batch_id("too-long");
  v1::Sequence* seq = batch.add_sequences();
  seq->set_sequence_id(77);
  for (int i = 0; i < 70; ++i) seq->add_prompt_token_ids(100 + i);
  seq->set_max_tokens(4);
  grpc::ClientContext ctx;
  auto reader = worker->Execute(&ctx, batch);
  v1::TokenEvent ev;
  std::vector<v1::SequenceEvent> events;
  while (reader->Read(&ev)) events.insert(events.end(), ev.sequences().begin(), ev.sequences().end());
  s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].sequence_id(), 77u);
  EXPECT_EQ(events[0].state(), v1::FINISH_STATE_INVALID);
  EXPECT_NE(events[0].error().find("context of 64 tokens"), std::string::npos) << events[0].error();

  // The first request finishes normally: a generation that reaches the context ends with LENGTH.
  EXPECT_TRUE(running.Wait().ok());
  EXPECT_GT(running.tokens().size(), 0u);
  Stream after(stub.get(), TextRequest("Still serving?", 4, 9));
  EXPECT_TRUE(after.Wait().ok());
  EXPECT_EQ(after.tokens().size(), 4u);
}

TEST_F(CpuClusterTest, CorruptCheckpointIsRefusedAtStartNamingTheFile) {
  const std::string bad = root_ + "/corrupt";
  fs::create_directories(bad);
  for (const auto& e : fs::directory_iterator(model_)) fs::copy_file(e.path(), bad + "/" + e.path().filename().string());
  {
    std::fstream f(bad + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = 1ull << 40;  // a header length far past the end of the file
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  Subprocess worker;
  ASSERT_TRUE(worker.Start({std::string(TAILSERVE_BIN_DIR) + "/tailserve-worker", "--backend", "cpu", "--model", bad,
                            "--grpc-port", "0", "--http-port", "0"},
                           bad + "/worker.log").ok());
  absl::StatusOr<int> rc = worker.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(rc.ok());
  EXPECT_TRUE(WIFEXITED(*rc) && WEXITSTATUS(*rc) == 1);
  std::ifstream log(bad + "/worker.log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("model.safetensors: corrupt header"), std::string::npos) << text;
}

}  // namespace
}  // namespace tailserve
