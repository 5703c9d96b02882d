// The CPU engine's own consistency on synthetic MoE and dense checkpoints: a prompt prefilled in one
// Forward and then decoded a token at a time gives the logits a teacher-forced Forward over the
// same tokens gives, and a sequence batched with others gives what it gives alone, at prompt
// lengths around every chunk and capacity boundary (powers of two, 128) and several expert counts.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "tools/checkpoint/checkpoint_maker.h"
#include "worker/backends/cpu/cpu_engine.h"

namespace tailserve {
namespace {

constexpr int kVocab = 1536;
const int kPromptLengths[] = {1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 128, 129, 130, 255, 256, 257, 400};

// The checkpoint shape: Mixtral-style, top-2, hidden 256, head_dim 32, 2 layers, vocab
// 1536; `experts` 0 makes it dense. Written once per expert count for the whole test binary.
const std::string& Checkpoint(int experts) {
  static std::map<int, std::string> dirs;
  auto it = dirs.find(experts);
  if (it != dirs.end()) return it->second;
  ModelConfig c;
  c.arch = experts > 0 ? Architecture::kMixtral : Architecture::kLlama;
  c.vocab_size = kVocab;
  c.hidden_size = 256, c.intermediate_size = 512, c.num_layers = 2, c.num_heads = 8, c.num_kv_heads = 2;
  c.head_dim = 32, c.max_position = 1024, c.rope.theta = 1e6;
  if (experts > 0) c.num_experts = experts, c.experts_per_token = 2;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("tailserve_consistency_" + std::to_string(::getpid()) + "_" + std::to_string(experts)))
                              .string();
  std::filesystem::remove_all(dir);
  const absl::Status s = WriteCheckpoint({.config = c, .seed = 11}, dir);
  EXPECT_TRUE(s.ok()) << s;
  return dirs[experts] = dir;
}

std::vector<int32_t> Prompt(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(length));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % kVocab);
  return t;
}

double RelL2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

int32_t Argmax(const float* row) { return static_cast<int32_t>(std::max_element(row, row + kVocab) - row); }

class StepConsistencyTest : public ::testing::TestWithParam<int> {};

// Prefill in one Forward, then 6 greedy tokens one at a time (as Engine::Step runs them), against
// one teacher-forced Forward over prompt + the generated tokens.
TEST_P(StepConsistencyTest, DecodeAfterPrefillEqualsFullForward) {
  auto engine = CpuEngine::Load(Checkpoint(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Sampling greedy;
  uint64_t id = 1;
  for (int length : kPromptLengths) {
    std::vector<int32_t> tokens = Prompt(length, 100 + length);
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

// Two sequences of different prompt lengths stepped together with Engine::Step give the tokens
// each gives alone.
TEST_P(StepConsistencyTest, BatchedStepsEqualAlone) {
  auto engine = CpuEngine::Load(Checkpoint(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Sampling greedy;
  auto generate = [&](std::vector<std::vector<int32_t>> prompts, uint64_t first_id) {
    std::vector<std::vector<int32_t>> tokens = prompts;
    for (int step = 0; step < 6; ++step) {
      std::vector<StepSequence> batch;
      for (size_t i = 0; i < tokens.size(); ++i) {
        batch.push_back({first_id + i, &tokens[i], static_cast<int32_t>(prompts[i].size()),
                         step == 0 ? 0 : static_cast<int32_t>(tokens[i].size()) - 1, &greedy});
      }
      std::vector<int32_t> next;
      EXPECT_TRUE((*engine)->Step(batch, &next).ok());
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i].push_back(next[i]);
    }
    for (size_t i = 0; i < tokens.size(); ++i) (*engine)->Release(first_id + i);
    return tokens;
  };
  uint64_t id = 1000;
  for (int length : kPromptLengths) {
    const std::vector<int32_t> a = Prompt(length, 7 + length), b = Prompt(length / 2 + 3, 9 + length);
    const auto together = generate({a, b}, id);
    id += 2;
    const auto alone_a = generate({a}, id++);
    const auto alone_b = generate({b}, id++);
    EXPECT_EQ(together[0], alone_a[0]) << GetParam() << " experts, prompt " << length;
    EXPECT_EQ(together[1], alone_b[0]) << GetParam() << " experts, prompt " << length;
  }
}

INSTANTIATE_TEST_SUITE_P(Experts, StepConsistencyTest, ::testing::Values(0, 2, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "_experts"; });

}  // namespace
}  // namespace tailserve
