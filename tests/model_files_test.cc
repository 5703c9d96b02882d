// Model files: safetensors parsing and refusal of damaged files, config.json in both RoPE
// conventions, llama3 RoPE scaling, the checkpoint maker's output (sharded too) loading back, and
// Mistral's sliding window.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <limits>
#include <set>

#include "common/model/checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "tools/checkpoint/checkpoint_maker.h"
#include "worker/backends/cpu/cpu_engine.h"
#include "worker/engine/sampling.h"

namespace tailserve {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tailserve-model-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ModelConfig TinyConfig(Architecture arch = Architecture::kLlama) {
  ModelConfig c = *PresetConfig("tiny");
  c.arch = arch;
  c.vocab_size = 97;  // odd sizes on purpose
  c.hidden_size = 48, c.intermediate_size = 80, c.num_layers = 2, c.num_heads = 6, c.num_kv_heads = 2, c.head_dim = 8;
  c.max_position = 128;
  c.tie_word_embeddings = false;
  if (arch == Architecture::kQwen2) c.qkv_bias = true;
  if (arch == Architecture::kMixtral) c.num_experts = 3, c.experts_per_token = 2;
  return c;
}

std::string Write(const std::string& dir, const ModelConfig& c, uint64_t seed = 3, uint64_t shard_bytes = 1ull << 40,
                  const std::string& format = "hf4") {
  CheckpointSpec spec{.config = c, .seed = seed, .init_std = 0.2f, .tokenizer_dir = "", .config_format = format,
                      .shard_bytes = shard_bytes};
  EXPECT_TRUE(WriteCheckpoint(spec, dir).ok());
  return dir;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(SafetensorsTest, ReadsWhatTheWriterWrote) {
  TempDir tmp;
  const std::string path = tmp.path() + "/t.safetensors";
  auto w = SafetensorsWriter::Create(path, {{"a", DType::kF32, {2, 3}}, {"b", DType::kBF16, {3}}}, {{"format", "pt"}});
  ASSERT_TRUE(w.ok());
  const float a[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
  const uint16_t b[3] = {FloatToBf16(1.5f), FloatToBf16(-0.25f), FloatToBf16(3.0f)};
  ASSERT_TRUE((*w)->Write({reinterpret_cast<const std::byte*>(a), sizeof(a)}).ok());
  ASSERT_TRUE((*w)->Write({reinterpret_cast<const std::byte*>(b), sizeof(b)}).ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const TensorInfo& tb = (*f)->tensors().at("b");
  EXPECT_EQ(tb.shape, std::vector<int64_t>{3});
  float out[3];
  ToFloat(tb.dtype, tb.data, 3, out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -0.25f);
  EXPECT_EQ(out[2], 3.0f);
  const TensorInfo& ta = (*f)->tensors().at("a");
  float outa[6];
  ToFloat(ta.dtype, ta.data, 6, outa);
  EXPECT_EQ(outa[2], 3.5f);
  EXPECT_EQ(outa[5], -7.0f);
}

TEST(SafetensorsTest, Fp16ConvertsExactly) {
  const uint16_t h[5] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x3555};  // 1, -2, smallest subnormal, 65504, ~1/3
  float out[5];
  ToFloat(DType::kF16, reinterpret_cast<const std::byte*>(h), 5, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[3], 65504.0f);
  EXPECT_NEAR(out[4], 1.0f / 3, 1e-4);
}

TEST(SafetensorsTest, RefusesDamagedFilesNamingThem) {
  TempDir tmp;
  const std::string dir = Write(tmp.path() + "/m", TinyConfig());
  const std::string file = dir + "/model.safetensors";
  const std::string good = ReadAll(file);

  WriteAll(file, good.substr(0, good.size() - 100));  // truncated
  auto s = SafetensorsFile::Open(file).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.safetensors: tensor "), std::string::npos) << s;
  EXPECT_NE(s.message().find("extends past the end of the file"), std::string::npos) << s;

  std::string bad = good;
  bad[8] = '[';  // header is no longer a JSON object
  WriteAll(file, bad);
  s = SafetensorsFile::Open(file).status();
  EXPECT_NE(s.message().find("model.safetensors: corrupt header"), std::string::npos) << s;

  WriteAll(file, good.substr(0, 5));
  s = SafetensorsFile::Open(file).status();
  EXPECT_NE(s.message().find("too short"), std::string::npos) << s;
}

TEST(CheckpointTest, RefusesMissingAndMisShapedTensors) {
  TempDir tmp;
  ModelConfig c = TinyConfig();
  const std::string dir = Write(tmp.path() + "/m", c);
  ASSERT_TRUE(LoadCheckpoint(dir).ok());

  // The config asks for more layers than the file has.
  ModelConfig deeper = c;
  deeper.num_layers = 3;
  WriteAll(dir + "/config.json", ConfigJson(deeper, "hf4"));
  auto s = LoadCheckpoint(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tensor model.layers.2.input_layernorm.weight is missing"), std::string::npos) << s;

  ModelConfig wider = c;
  wider.intermediate_size = 81;
  WriteAll(dir + "/config.json", ConfigJson(wider, "hf4"));
  s = LoadCheckpoint(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.safetensors: tensor model.layers.0.mlp.gate_proj.weight has shape [80, 48], "
                             "the config needs [81, 48]"), std::string::npos) << s;
}

TEST(ModelConfigTest, RefusesUnsupportedArchitectureAndRope) {
  auto s = ParseModelConfig(R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10})").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("config.json: architectures \"GPT2LMHeadModel\" is not supported"), std::string::npos) << s;
  nlohmann::json j = nlohmann::json::parse(ConfigJson(TinyConfig(), "hf4"));
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
  s = ParseModelConfig(j.dump()).status();
  EXPECT_NE(s.message().find("rope_scaling.rope_type \"yarn\" is not supported"), std::string::npos) << s;
  j = nlohmann::json::parse(ConfigJson(TinyConfig(), "hf4"));
  j.erase("hidden_size");
  s = ParseModelConfig(j.dump()).status();
  EXPECT_NE(s.message().find("config.json: hidden_size is missing"), std::string::npos) << s;
}

TEST(ModelConfigTest, BothRopeConventionsParseAlike) {
  ModelConfig c = *PresetConfig("llama-3.1-8b");
  c.vocab_size = 128256;
  for (const char* format : {"hf4", "hf5"}) {
    auto parsed = ParseModelConfig(ConfigJson(c, format));
    ASSERT_TRUE(parsed.ok()) << format << ": " << parsed.status();
    EXPECT_EQ(parsed->rope.type, RopeConfig::Type::kLlama3) << format;
    EXPECT_EQ(parsed->rope.theta, 500000) << format;
    EXPECT_EQ(parsed->rope.factor, 8) << format;
    EXPECT_EQ(parsed->rope.original_max_position, 8192) << format;
    EXPECT_EQ(parsed->dtype, DType::kBF16) << format;
    EXPECT_EQ(parsed->num_kv_heads, 8) << format;
  }
  // Real Llama 3.1 config.json (transformers 4), trimmed to what the loader reads.
  auto real = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
      "intermediate_size": 14336, "max_position_embeddings": 131072, "num_attention_heads": 32,
      "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "rope_theta": 500000.0, "torch_dtype": "bfloat16", "vocab_size": 128256,
      "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})");
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ(real->head_dim, 128);
  EXPECT_EQ(real->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
}

TEST(ModelConfigTest, Llama3RopeScalingFollowsTheThreeBands) {
  ModelConfig c = *PresetConfig("llama-3.1-8b");
  c.dtype = DType::kF32;  // no rounding: compare with the formula directly
  ModelConfig plain = c;
  plain.rope.type = RopeConfig::Type::kDefault;
  const std::vector<float> scaled = RopeInverseFrequencies(c), base = RopeInverseFrequencies(plain);
  ASSERT_EQ(scaled.size(), 64u);
  for (size_t i = 0; i < scaled.size(); ++i) {
    const double wavelen = 2 * M_PI / base[i];
    if (wavelen < 8192.0 / 4) {  // high frequencies: unchanged
      EXPECT_EQ(scaled[i], base[i]) << i;
    } else if (wavelen > 8192.0 / 1) {  // low frequencies: divided by the factor
      EXPECT_FLOAT_EQ(scaled[i], base[i] / 8) << i;
    } else {  // in between: smooth interpolation, strictly between the two
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(scaled[i], (1 - smooth) * base[i] / 8 + smooth * base[i], 1e-6 * base[i]) << i;
      EXPECT_LT(scaled[i], base[i]);
      EXPECT_GT(scaled[i], base[i] / 8);
    }
  }
  EXPECT_EQ(scaled[0], 1.0f);
}

TEST(CheckpointMakerTest, SameSeedSameBytesAndShardsLoadLikeOneFile) {
  TempDir tmp;
  const ModelConfig c = TinyConfig(Architecture::kMixtral);
  const std::string one = Write(tmp.path() + "/one", c, 5);
  const std::string again = Write(tmp.path() + "/again", c, 5);
  EXPECT_EQ(ReadAll(one + "/model.safetensors"), ReadAll(again + "/model.safetensors"));
  const std::string sharded = Write(tmp.path() + "/sharded", c, 5, /*shard_bytes=*/20000, "hf5");
  EXPECT_TRUE(fs::exists(sharded + "/model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(sharded)) shards += e.path().extension() == ".safetensors";
  EXPECT_GE(shards, 3);
  auto a = CpuEngine::Load(one), b = CpuEngine::Load(sharded);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<int32_t> tokens = {5, 17, 96, 0, 44, 3, 3, 71};
  Sampling greedy;
  StepSequence seq{1, &tokens, 8, 0, &greedy};
  std::vector<float> la, lb;
  ASSERT_TRUE((*a)->Forward({&seq, 1}, true, &la).ok());
  ASSERT_TRUE((*b)->Forward({&seq, 1}, true, &lb).ok());
  EXPECT_EQ(la, lb);

  // A shard the index names but that is missing is refused naming it.
  for (const auto& e : fs::directory_iterator(sharded)) {
    if (e.path().filename().string().rfind("model-00001", 0) == 0) fs::remove(e.path());
  }
  auto s = LoadCheckpoint(sharded).status();
  EXPECT_NE(s.message().find("model-00001-of-"), std::string::npos) << s;
}

TEST(CpuEngineModelTest, MistralSlidingWindowLimitsAttention) {
  TempDir tmp;
  ModelConfig c = TinyConfig(Architecture::kMistral);
  const std::string full = Write(tmp.path() + "/full", c, 9);
  c.sliding_window = 4;
  const std::string window = Write(tmp.path() + "/window", c, 9);
  auto a = CpuEngine::Load(full), b = CpuEngine::Load(window);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  Sampling greedy;
  StepSequence seq{1, &tokens, 11, 0, &greedy};
  std::vector<float> la, lb;
  ASSERT_TRUE((*a)->Forward({&seq, 1}, true, &la).ok());
  ASSERT_TRUE((*b)->Forward({&seq, 1}, true, &lb).ok());
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  for (size_t p = 0; p < tokens.size(); ++p) {
    const bool same = std::equal(la.begin() + p * vocab, la.begin() + (p + 1) * vocab, lb.begin() + p * vocab);
    // Positions 0..3 see at most 4 tokens either way; later ones lose their oldest tokens.
    EXPECT_EQ(same, p < 4) << "position " << p;
  }
}

TEST(CpuEngineModelTest, BatchedStepEqualsOneSequenceAtATime) {
  TempDir tmp;
  const std::string dir = Write(tmp.path() + "/q", TinyConfig(Architecture::kQwen2), 4);
  auto engine = CpuEngine::Load(dir);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<int32_t>> prompts = {{1}, {4, 5, 6}, {90, 91, 92, 93, 94, 95, 96}};
  Sampling greedy;
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    StepSequence s{100 + i, &prompts[i], static_cast<int32_t>(prompts[i].size()), 0, &greedy};
    alone.emplace_back();
    ASSERT_TRUE((*engine)->Forward({&s, 1}, false, &alone.back()).ok());
  }
  std::vector<StepSequence> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    batch.push_back({200 + i, &prompts[i], static_cast<int32_t>(prompts[i].size()), 0, &greedy});
  }
  std::vector<float> together;
  ASSERT_TRUE((*engine)->Forward(batch, false, &together).ok());
  const size_t vocab = 97;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (size_t v = 0; v < vocab; ++v) EXPECT_NEAR(together[i * vocab + v], alone[i][v], 1e-5) << i << " " << v;
  }
}

TEST(SamplingTest, GreedyTopKTopPAndSeeds) {
  std::vector<std::pair<float, int32_t>> scratch;
  const std::vector<float> logits = {0.0f, 3.0f, 2.9f, -1.0f, 1.0f};
  EXPECT_EQ(SampleToken(logits, {}, 0, &scratch), 1);  // greedy
  Sampling k1{.temperature = 1, .top_k = 1, .seed = 3};
  EXPECT_EQ(SampleToken(logits, k1, 0, &scratch), 1);
  // top_k = 2: only ids 1 and 2 ever come out; both do.
  Sampling k2{.temperature = 1, .top_k = 2};
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    k2.seed = seed;
    seen.insert(SampleToken(logits, k2, 7, &scratch));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2}));
  // top_p small enough that only the best token's mass is needed.
  Sampling p{.temperature = 1, .top_p = 0.3f};
  seen.clear();
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    seen.insert(SampleToken(logits, p, 7, &scratch));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1}));
  // A temperature so small that logit / temperature overflows still picks the best token, and a
  // NaN temperature (a raw request the router never sends) means greedy.
  for (float temperature : {1e-40f, 1e-30f, std::numeric_limits<float>::quiet_NaN()}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      EXPECT_EQ(SampleToken(logits, {.temperature = temperature, .seed = seed}, 7, &scratch), 1) << temperature;
    }
  }
  // Frequencies follow the softmax at temperature 1 (ids 1 and 2: e^0.1 : 1), within sampling noise.
  Sampling t{.temperature = 1, .top_k = 2};
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    t.seed = static_cast<uint64_t>(i);
    ones += SampleToken(logits, t, 0, &scratch) == 1;
  }
  const double want = std::exp(0.1) / (std::exp(0.1) + 1);
  EXPECT_NEAR(ones / double(n), want, 0.015) << "seeds 0.." << n;
}

TEST(SamplingTest, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {0.0f, 3.0f, 2.9f, -1.0f, 1.0f, nan, -inf, 1.0f};
  double sum = 0;
  for (float l : {0.0f, 3.0f, 2.9f, -1.0f, 1.0f, 1.0f}) sum += std::exp(double(l));
  const double lse = std::log(sum);
  TokenLogprobs lp;
  ComputeLogprobs(logits, 2, 4, &lp);
  EXPECT_NEAR(lp.logprob, 2.9 - lse, 1e-6);
  // Most likely first; the tie between ids 4 and 7 (logit 1) goes to the lower id.
  ASSERT_EQ(lp.top.size(), 4u);
  const std::vector<std::pair<int32_t, double>> want = {{1, 3.0}, {2, 2.9}, {4, 1.0}, {7, 1.0}};
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(lp.top[k].first, want[k].first) << k;
    EXPECT_NEAR(lp.top[k].second, want[k].second - lse, 1e-6) << k;
  }
  // No alternatives asked; a token whose logit is not finite has probability 0; more asked than
  // there are finite logits lists only those (NaN and -inf never appear).
  ComputeLogprobs(logits, 1, 0, &lp);
  EXPECT_NEAR(lp.logprob, 3.0 - lse, 1e-6);
  EXPECT_TRUE(lp.top.empty());
  ComputeLogprobs(logits, 5, 20, &lp);
  EXPECT_EQ(lp.logprob, -inf);
  EXPECT_EQ(lp.top.size(), 6u);
  // Shifting every logit changes nothing (the log-softmax, not the logits, comes back).
  std::vector<float> shifted = logits;
  for (float& l : shifted) l += 1000.0f;
  TokenLogprobs lp2;
  ComputeLogprobs(shifted, 1, 2, &lp2);
  EXPECT_NEAR(lp2.logprob, 3.0 - lse, 1e-4);
  EXPECT_NEAR(lp2.top[1].second, 2.9 - lse, 1e-4);
}

}  // namespace
}  // namespace tailserve
