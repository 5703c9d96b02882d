#pragma once
// Synthetic checkpoints the engine consistency tests share: the Mixtral-style shape of the MoE
// report in issue 66 (`tailserve-make-checkpoint --preset mixtral-tiny --experts 8 --hidden 256
// --head-dim 32 --layers 2 --vocab 1536`: top-2, 6 heads / 2 KV heads, ffn 384, seed 0) with
// `experts` experts, or its dense Llama twin with 0. Written once per expert count per process.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tools/checkpoint/checkpoint_maker.h"

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
  static const std::vector<int> lengths = {1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 128, 129, 130, 200, 255, 256, 257, 400};
  return lengths;
}

}  // namespace tailserve::testing
