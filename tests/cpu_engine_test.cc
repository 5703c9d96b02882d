// The CPU backend against what HuggingFace transformers computes for the reference checkpoints
// (../shared/reference, and the shipped default model models/tiny-en): teacher-forced logits at every position, greedy continuation, and the
// engine's own consistency (one token at a time and batched equal all at once).
#include <gtest/gtest.h>

#include <cmath>
#include <span>

#include "common/model/safetensors.h"
#include "tests/reference_cases.h"
#include "tests/test_paths.h"
#include "worker/backends/cpu/cpu_engine.h"
#include "worker/engine/sampling.h"

namespace tailserve {
namespace {

using testing::RelL2;
using Case = testing::ReferenceCase;
using testing::ExpectedLogits;
using testing::LoadReferenceCases;

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, TeacherForcedLogitsMatchTransformers) {
  TAILSERVE_REQUIRE_CHECKPOINT(GetParam());
  const std::string dir = testing::CheckpointDir(GetParam());
  auto engine = CpuEngine::Load(dir);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto expected = SafetensorsFile::Open(testing::ExpectedDir(GetParam()) + "/expected_logits.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const int64_t vocab = (*engine)->config().vocab_size;
  uint64_t id = 1;
  for (const Case& c : LoadReferenceCases(testing::ExpectedDir(GetParam()))) {
    std::vector<int32_t> tokens = c.tokens();
    ASSERT_EQ((*expected)->tensors().at(c.logits_tensor).shape,
              (std::vector<int64_t>{static_cast<int64_t>(tokens.size()), vocab}));
    const std::vector<float> want_f = ExpectedLogits(**expected, c);

    Sampling greedy;
    StepSequence seq{id++, &tokens, static_cast<int32_t>(c.prompt.size()), 0, &greedy};
    std::vector<float> logits;
    ASSERT_TRUE((*engine)->Forward({&seq, 1}, /*all_positions=*/true, &logits).ok());
    ASSERT_EQ(logits.size(), want_f.size());
    double worst = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
      const double err = RelL2(logits.data() + p * vocab, want_f.data() + p * vocab, static_cast<size_t>(vocab));
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-4) << GetParam() << " " << c.logits_tensor << " position " << p;
    }
    RecordProperty(c.logits_tensor + "_worst_rel_l2", std::to_string(worst));
    (*engine)->Release(seq.id);
  }
}

// What each KV cache format costs in accuracy by itself, with fp32 maths everywhere else: the
// floor under what the CUDA backend can reach with that format.
TEST_P(ReferenceTest, KvFormatEmulationError) {
  TAILSERVE_REQUIRE_CHECKPOINT(GetParam());
  const std::string dir = testing::CheckpointDir(GetParam());
  auto expected = SafetensorsFile::Open(testing::ExpectedDir(GetParam()) + "/expected_logits.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  double mean[3] = {};
  for (KvDtype d : {KvDtype::kFp16, KvDtype::kFp8E4M3, KvDtype::kFp8E5M2}) {
    auto engine = CpuEngine::Load(dir, {.kv_emulation = d});
    ASSERT_TRUE(engine.ok()) << engine.status();
    const int64_t vocab = (*engine)->config().vocab_size;
    double worst = 0, sum = 0;
    int count = 0;
    uint64_t id = 1;
    for (const Case& c : LoadReferenceCases(testing::ExpectedDir(GetParam()))) {
      std::vector<int32_t> tokens = c.tokens();
      const std::vector<float> want_f = ExpectedLogits(**expected, c);
      Sampling greedy;
      StepSequence seq{id++, &tokens, static_cast<int32_t>(c.prompt.size()), 0, &greedy};
      std::vector<float> logits;
      ASSERT_TRUE((*engine)->Forward({&seq, 1}, /*all_positions=*/true, &logits).ok());
      for (size_t p = 0; p < tokens.size(); ++p) {
        const double err = RelL2(logits.data() + p * vocab, want_f.data() + p * vocab, static_cast<size_t>(vocab));
        worst = std::max(worst, err), sum += err, ++count;
      }
      (*engine)->Release(seq.id);
    }
    std::printf("[ %s %s ] worst rel L2 %.4f, mean %.4f\n", GetParam().c_str(), KvDtypeName(d), worst, sum / count);
    mean[static_cast<int>(d)] = sum / count;
    if (d == KvDtype::kFp16) {
      EXPECT_LE(worst, 3e-3) << GetParam();  // measured 1.3-1.8e-3
    }
  }
  // One mantissa bit more, half the rounding error.
  EXPECT_LT(mean[static_cast<int>(KvDtype::kFp8E4M3)], 0.75 * mean[static_cast<int>(KvDtype::kFp8E5M2)]) << GetParam();
}

TEST(KvDtypeTest, RoundingMatchesTheFormats) {
  // E4M3: 3 mantissa bits, smallest normal 2^-6, max 448; ties to even.
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E4M3, 1.0625f), 1.0f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E4M3, 1.1875f), 1.25f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E4M3, 0.3f), 0.3125f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E4M3, -0.3f), -0.3125f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E4M3, 500.0f), 448.0f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E4M3, std::ldexp(3.0f, -10)), std::ldexp(1.0f, -8));  // subnormal, tie to even
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E4M3, std::ldexp(1.0f, -10)), 0.0f);
  // E5M2: 2 mantissa bits, max 57344.
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E5M2, 1.1f), 1.0f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E5M2, 1.2f), 1.25f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp8E5M2, 1e6f), 57344.0f);
  // fp16: 10 mantissa bits.
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp16, 1.0f + std::ldexp(1.0f, -11)), 1.0f);
  EXPECT_EQ(RoundToKvDtype(KvDtype::kFp16, 1.0f + std::ldexp(3.0f, -11)), 1.0f + std::ldexp(1.0f, -9));
  // A head's round trip: its largest magnitude maps to the format's max and comes back exactly.
  std::vector<float> head = {0.5f, -2.0f, 0.013f, 1.7f};
  QuantizeKvHead(KvDtype::kFp8E4M3, head.data(), head.size());
  EXPECT_FLOAT_EQ(head[1], -2.0f);
  EXPECT_NEAR(head[0], 0.5f, 0.5f * 0.0625f);
  EXPECT_NEAR(head[2], 0.013f, 0.013f * 0.0625f);
  EXPECT_NEAR(head[3], 1.7f, 1.7f * 0.0625f);
}

TEST_P(ReferenceTest, GreedyGenerationReproducesTransformers) {
  TAILSERVE_REQUIRE_CHECKPOINT(GetParam());
  const std::string dir = testing::CheckpointDir(GetParam());
  auto engine = CpuEngine::Load(dir);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<Case> cases = LoadReferenceCases(testing::ExpectedDir(GetParam()));
  // All cases decode together, as one batch: batching must not change anyone's tokens.
  std::vector<std::vector<int32_t>> tokens;
  for (const Case& c : cases) tokens.push_back(c.prompt);
  Sampling greedy;
  std::vector<int32_t> computed(cases.size(), 0);
  for (size_t step = 0; step < 24; ++step) {
    std::vector<StepSequence> batch;
    for (size_t i = 0; i < cases.size(); ++i) {
      batch.push_back({i + 1, &tokens[i], static_cast<int32_t>(cases[i].prompt.size()), computed[i], &greedy});
    }
    std::vector<int32_t> next;
    ASSERT_TRUE((*engine)->Step(batch, &next).ok());
    for (size_t i = 0; i < cases.size(); ++i) {
      const size_t pos = cases[i].prompt.size() + step;  // the position whose logits chose this token
      if (cases[i].margin[pos - 1] >= 1e-3f) {
        EXPECT_EQ(next[i], cases[i].greedy[step]) << GetParam() << " case " << i << " step " << step;
      }
      // Teacher-force HF's token so one near-tie cannot derail the rest of the comparison.
      tokens[i].push_back(cases[i].greedy[step]);
      computed[i] = static_cast<int32_t>(tokens[i].size()) - 1;
    }
  }
}

// The log-probabilities a step returns are those of transformers' logits: the sampled token's and
// the 5 most likely, at each position of a teacher-forced greedy continuation.
TEST_P(ReferenceTest, LogprobsMatchTransformersLogSoftmax) {
  TAILSERVE_REQUIRE_CHECKPOINT(GetParam());
  auto engine = CpuEngine::Load(testing::CheckpointDir(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto expected = SafetensorsFile::Open(testing::ExpectedDir(GetParam()) + "/expected_logits.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const int64_t vocab = (*engine)->config().vocab_size;
  const Case c = LoadReferenceCases(testing::ExpectedDir(GetParam()))[0];
  const std::vector<float> want_logits = ExpectedLogits(**expected, c);
  Sampling sampling{.top_logprobs = 5};
  std::vector<int32_t> tokens = c.prompt;
  double worst = 0;
  for (size_t step = 0; step < std::min<size_t>(8, c.greedy.size()); ++step) {
    TokenLogprobs got;
    StepSequence seq{1, &tokens, static_cast<int32_t>(c.prompt.size()),
                     step == 0 ? 0 : static_cast<int32_t>(tokens.size()) - 1, &sampling};
    seq.logprobs = &got;
    std::vector<int32_t> next;
    ASSERT_TRUE((*engine)->Step({&seq, 1}, &next).ok());
    const size_t pos = tokens.size() - 1;
    TokenLogprobs want;
    ComputeLogprobs(std::span<const float>(want_logits.data() + pos * vocab, static_cast<size_t>(vocab)), next[0], 5,
                    &want);
    worst = std::max(worst, std::abs(double(got.logprob) - want.logprob));
    EXPECT_NEAR(got.logprob, want.logprob, 2e-3) << GetParam() << " step " << step;
    ASSERT_EQ(got.top.size(), 5u);
    EXPECT_EQ(got.top[0].first, next[0]);  // greedy: the sampled token is the most likely
    for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(got.top[k].second, want.top[k].second, 2e-3) << "rank " << k;
    tokens.push_back(c.greedy[step]);  // teacher-forced, as the reference was computed
  }
  RecordProperty("worst_logprob_abs_error", std::to_string(worst));
}

TEST_P(ReferenceTest, IncrementalDecodeEqualsFullForward) {
  TAILSERVE_REQUIRE_CHECKPOINT(GetParam());
  const std::string dir = testing::CheckpointDir(GetParam());
  auto engine = CpuEngine::Load(dir);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const Case c = LoadReferenceCases(testing::ExpectedDir(GetParam()))[2];
  std::vector<int32_t> tokens = c.tokens();
  Sampling greedy;
  StepSequence full{1, &tokens, static_cast<int32_t>(tokens.size()), 0, &greedy};
  std::vector<float> all;
  ASSERT_TRUE((*engine)->Forward({&full, 1}, true, &all).ok());
  const int64_t vocab = (*engine)->config().vocab_size;
  std::vector<int32_t> growing(tokens.begin(), tokens.begin() + 5);
  for (size_t n = 5; n <= tokens.size(); ++n) {
    growing.resize(n);
    std::copy(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n), growing.begin());
    StepSequence s{2, &growing, 5, n == 5 ? 0 : static_cast<int32_t>(n) - 1, &greedy};
    std::vector<float> last;
    ASSERT_TRUE((*engine)->Forward({&s, 1}, false, &last).ok());
    EXPECT_LE(RelL2(last.data(), all.data() + (n - 1) * vocab, static_cast<size_t>(vocab)), 1e-5) << "length " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ReferenceTest, ::testing::Values("llama-gqa", "qwen2-bias-tied", "mixtral-moe", "tiny-en"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

TEST(CpuEngineTest, SeededSamplingRepeatsAndDiffersAcrossSeeds) {
  TAILSERVE_REQUIRE_SHARED();
  auto engine = CpuEngine::Load(testing::ReferenceDir("llama-gqa"));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto generate = [&](uint64_t seed, uint64_t id) {
    Sampling s{.temperature = 1.0f, .top_p = 0.9f, .top_k = 50, .seed = seed};
    std::vector<int32_t> tokens = {1, 843, 20, 77};
    for (int i = 0; i < 16; ++i) {
      StepSequence seq{id, &tokens, 4, i == 0 ? 0 : static_cast<int32_t>(tokens.size()) - 1, &s};
      std::vector<int32_t> next;
      EXPECT_TRUE((*engine)->Step({&seq, 1}, &next).ok());
      tokens.push_back(next[0]);
    }
    (*engine)->Release(id);
    return tokens;
  };
  const auto a = generate(7, 1), b = generate(7, 2), c = generate(8, 3);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(CpuEngineTest, RefusesSequencesBeyondTheContext) {
  TAILSERVE_REQUIRE_SHARED();
  auto engine = CpuEngine::Load(testing::ReferenceDir("qwen2-bias-tied"));
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<int32_t> tokens((*engine)->max_context() + 1, 5);
  Sampling greedy;
  StepSequence seq{1, &tokens, static_cast<int32_t>(tokens.size()), 0, &greedy};
  std::vector<int32_t> next;
  const absl::Status s = (*engine)->Step({&seq, 1}, &next);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
}

}  // namespace
}  // namespace tailserve
