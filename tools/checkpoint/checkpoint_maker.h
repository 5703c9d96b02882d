#pragma once
// Writes deterministic synthetic checkpoints in the HuggingFace layout (config.json,
// generation_config.json, bf16 safetensors shards + index, tokenizer files): the embedded default
// model of the demo and CI, and real-size shapes (e.g. Llama-3.1-8B) for GPU benchmarks.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/model/model_config.h"

namespace tailserve {

struct CheckpointSpec {
  ModelConfig config;      // shapes, RoPE, eos/bos ids
  uint64_t seed = 0;       // same seed, same bytes
  float init_std = 0.02f;  // weights ~ uniform with this standard deviation; norms are 1
  std::string tokenizer_dir;  // copied in (tokenizer.json, tokenizer_config.json); empty: none
  // "hf4": rope_theta + rope_scaling, torch_dtype (most published checkpoints);
  // "hf5": rope_parameters, dtype (transformers 5).
  std::string config_format = "hf4";
  uint64_t shard_bytes = 5ull << 30;  // above this a new shard starts (index.json written)
};

// A preset by name: "tiny" (the demo model), "llama-3.2-1b", "llama-3.1-8b", "mixtral-tiny",
// "qwen2-tiny". The vocabulary is left for the caller (the tokenizer's size).
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name);

absl::Status WriteCheckpoint(const CheckpointSpec& spec, const std::string& out_dir);

// config.json text for `config` in the given format (also used by tests to exercise the loader).
std::string ConfigJson(const ModelConfig& config, const std::string& format);

}  // namespace tailserve
