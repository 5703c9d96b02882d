#pragma once
// Synthetic checkpoints the engine consistency tests share: the Mixtral-style shape of the MoE
// report in issue 66 (`tailserve-make-checkpoint --preset mixtral-tiny --experts 8 --hidden 256
// --head-dim 32 --layers 2 --vocab 1536`: top-2, 6 heads / 2 KV heads, ffn 384, seed 0) with
// `experts` experts, or its dense Llama twin with 0. Written once per expert count per process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tools/checkpoint/checkpoint_maker.h"
#include "worker/engine/engine.h"

namespace tailserve::testing {

inline constexpr int kSyntheticVocab = 1536;

inline const std::string& SyntheticCheckpoint(int experts) {
  static std::map<int, std::string> dirs;
  if (auto it = dirs.find(experts); it != dirs.end()) return it->second;
  ModelConfig c = *PresetConfig("mixtral-tiny");
  c.vocab_size = kSyntheticVocab;
  c.hidden_size = 256, c.head_dim = 32, c.num_layers = 2;
  if (experts > 0) {
    c.num_experts = experts;
  } else {
    c.arch = Architecture::kLlama, c.num_experts = 0, c.experts_per_token = 0;
  }
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("tailserve_synthetic_" + std::to_string(::getpid()) + "_" + std::to_string(experts)))
                              .string();
  std::filesystem::remove_all(dir);
  const absl::Status s = WriteCheckpoint({.config = c, .seed = 0}, dir);
  if (!s.ok()) std::fprintf(stderr, "synthetic checkpoint %s: %s\n", dir.c_str(), s.ToString().c_str());
  return dirs[experts] = dir;
}

// A prompt of `length` token ids, the same for the same seed.
inline std::vector<int32_t> SyntheticPrompt(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(length));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % kSyntheticVocab);
  return t;
}

// Lengths around every chunk and capacity boundary: powers of two, 128 (the largest decode bucket,
// whose cuBLASLt shapes are tuned at load) and a 128-row prefill chunk's multiples.
inline const std::vector<int>& BoundaryPromptLengths() {
  static const std::vector<int> lengths = {1,   2,   3,   15,  16,  17,  63,  64,  65,
                                           127, 128, 129, 130, 200, 255, 256, 257, 400};
  return lengths;
}

// Greedy tokens for `prompts` stepped together through Engine::Step for `steps` steps (ids
// first_id, first_id + 1, ..., released afterwards): each prompt followed by its tokens.
inline std::vector<std::vector<int32_t>> GenerateGreedy(Engine& engine, std::vector<std::vector<int32_t>> tokens,
                                                        uint64_t first_id, int steps) {
  Sampling greedy;
  std::vector<int32_t> prompt_lengths;
  for (const auto& t : tokens) prompt_lengths.push_back(static_cast<int32_t>(t.size()));
  for (int step = 0; step < steps; ++step) {
    std::vector<StepSequence> batch;
    for (size_t i = 0; i < tokens.size(); ++i) {
      batch.push_back({first_id + i, &tokens[i], prompt_lengths[i],
                       step == 0 ? 0 : static_cast<int32_t>(tokens[i].size()) - 1, &greedy});
    }
    std::vector<int32_t> next;
    const absl::Status s = engine.Step(batch, &next);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i].push_back(next[i]);
  }
  for (size_t i = 0; i < tokens.size(); ++i) engine.Release(first_id + i);
  return tokens;
}

}  // namespace tailserve::testing
