// The CPU engine's own consistency on synthetic MoE and dense checkpoints (the shape of issue 66's
// MoE report, tests/synthetic_checkpoints.h): a prompt prefilled in one Forward and then decoded a
// token at a time gives the logits a teacher-forced Forward over the same tokens gives, and a
// sequence batched with others gives what it gives alone, at prompt lengths around every chunk and
// capacity boundary and several expert counts.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/reference_cases.h"
#include "tests/synthetic_checkpoints.h"
#include "worker/backends/cpu/cpu_engine.h"

namespace tailserve {
namespace {

using testing::RelL2;
using testing::BoundaryPromptLengths;
using testing::SyntheticCheckpoint;
using testing::SyntheticPrompt;
constexpr int kVocab = testing::kSyntheticVocab;

int32_t Argmax(const float* row) { return static_cast<int32_t>(std::max_element(row, row + kVocab) - row); }

class StepConsistencyTest : public ::testing::TestWithParam<int> {};

// Prefill in one Forward, then 6 greedy tokens one at a time (as Engine::Step runs them), against
// one teacher-forced Forward over prompt + the generated tokens.
TEST_P(StepConsistencyTest, DecodeAfterPrefillEqualsFullForward) {
  auto engine = CpuEngine::Load(SyntheticCheckpoint(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Sampling greedy;
  uint64_t id = 1;
  for (int length : BoundaryPromptLengths()) {
    std::vector<int32_t> tokens = SyntheticPrompt(length, 100 + length);
    std::vector<std::vector<float>> step_logits;
    for (int step = 0; step < 6; ++step) {
      StepSequence s{id, &tokens, length, step == 0 ? 0 : static_cast<int32_t>(tokens.size()) - 1, &greedy};
      std::vector<float> last;
      ASSERT_TRUE((*engine)->Forward({&s, 1}, false, &last).ok());
      tokens.push_back(Argmax(last.data()));
      step_logits.push_back(std::move(last));
    }
    (*engine)->Release(id++);
    StepSequence full{id, &tokens, static_cast<int32_t>(tokens.size()), 0, &greedy};
    std::vector<float> all;
    ASSERT_TRUE((*engine)->Forward({&full, 1}, true, &all).ok());
    (*engine)->Release(id++);
    for (int step = 0; step < 6; ++step) {
      const float* want = all.data() + static_cast<size_t>(length - 1 + step) * kVocab;
      EXPECT_LE(RelL2(step_logits[step].data(), want, kVocab), 1e-4)
          << GetParam() << " experts, prompt " << length << ", step " << step;
    }
  }
}

// A prompt prefilled in chunks (a step-token budget's prefill chunks: tokens up to `end`, nothing
// sampled, beside another sequence decoding) ends with the logits of one whole prefill.
TEST_P(StepConsistencyTest, ChunkedPrefillEqualsWhole) {
  auto engine = CpuEngine::Load(SyntheticCheckpoint(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Sampling greedy;
  uint64_t id = 2000;
  for (int length : {2, 17, 129, 257}) {
    std::vector<int32_t> tokens = SyntheticPrompt(length, 300 + length);
    StepSequence whole{id++, &tokens, length, 0, &greedy};
    std::vector<float> want;
    ASSERT_TRUE((*engine)->Forward({&whole, 1}, false, &want).ok());
    (*engine)->Release(whole.id);
    // A sequence decoding beside the chunks all along.
    std::vector<int32_t> other = SyntheticPrompt(9, 5);
    const uint64_t other_id = id++, chunked_id = id++;
    std::vector<int32_t> next;
    StepSequence first_other{other_id, &other, 9, 0, &greedy};
    ASSERT_TRUE((*engine)->Step({&first_other, 1}, &next).ok());
    other.push_back(next[0]);
    int32_t computed = 0;
    for (int chunk : {7, 64}) {
      for (; computed + chunk < length - 1;) {
        std::vector<StepSequence> batch = {
            {chunked_id, &tokens, length, computed, &greedy, computed + chunk},
            {other_id, &other, 9, static_cast<int32_t>(other.size()) - 1, &greedy}};
        ASSERT_TRUE((*engine)->Step(batch, &next).ok());
        EXPECT_EQ(next[0], -1);  // a chunk samples nothing
        other.push_back(next[1]);
        computed += chunk;
        if (computed > length / 2) break;  // the rest in 64s
      }
    }
    StepSequence last{chunked_id, &tokens, length, computed, &greedy};
    std::vector<float> got;
    ASSERT_TRUE((*engine)->Forward({&last, 1}, false, &got).ok());
    EXPECT_LE(RelL2(got.data(), want.data(), kVocab), 1e-5) << GetParam() << " experts, prompt " << length;
    (*engine)->Release(chunked_id);
    (*engine)->Release(other_id);
    // A chunk must end past what is cached and before the last token.
    StepSequence bad{id++, &tokens, length, 0, &greedy, length};
    EXPECT_EQ((*engine)->Step({&bad, 1}, &next).code(), absl::StatusCode::kInvalidArgument);
  }
}

// Two sequences of different prompt lengths stepped together with Engine::Step give the tokens
// each gives alone.
TEST_P(StepConsistencyTest, BatchedStepsEqualAlone) {
  auto engine = CpuEngine::Load(SyntheticCheckpoint(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  uint64_t id = 1000;
  for (int length : BoundaryPromptLengths()) {
    const std::vector<int32_t> a = SyntheticPrompt(length, 7 + length), b = SyntheticPrompt(length / 2 + 3, 9 + length);
    const auto together = testing::GenerateGreedy(**engine, {a, b}, id, 6);
    id += 2;
    const auto alone_a = testing::GenerateGreedy(**engine, {a}, id++, 6);
    const auto alone_b = testing::GenerateGreedy(**engine, {b}, id++, 6);
    EXPECT_EQ(together[0], alone_a[0]) << GetParam() << " experts, prompt " << length;
    EXPECT_EQ(together[1], alone_b[0]) << GetParam() << " experts, prompt " << length;
  }
}

INSTANTIATE_TEST_SUITE_P(Experts, StepConsistencyTest, ::testing::Values(0, 2, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "_experts"; });

}  // namespace
}  // namespace tailserve
