#pragma once
// A HuggingFace checkpoint's config.json and generation_config.json, parsed into typed structs.
// Both RoPE conventions are read: `rope_theta` + `rope_scaling` (transformers 4) and
// `rope_parameters` (transformers 5).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/safetensors.h"

namespace tailserve {

enum class Architecture { kLlama, kQwen2, kMistral, kMixtral };
const char* ArchitectureName(Architecture a);  // the HF class name, e.g. "LlamaForCausalLM"

struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3 };
  double theta = 10000;
  Type type = Type::kDefault;
  double factor = 1;  // linear and llama3
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; Llama with attention_bias
  bool o_bias = false;    // Llama with attention_bias
  int64_t num_experts = 0;  // > 0: Mixtral-style MoE
  int64_t experts_per_token = 0;
  int64_t sliding_window = 0;  // 0: full attention
  std::vector<int32_t> eos_token_ids;  // generation_config.json, else config.json
  int32_t bos_token_id = -1;
  DType dtype = DType::kF32;  // "dtype" (transformers 5) or "torch_dtype" (4): the weights' type

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source = "config.json");
// Applies generation_config.json (EOS and BOS ids) to `config`.
absl::Status ApplyGenerationConfig(const std::string& json_text, ModelConfig* config,
                                   const std::string& source = "generation_config.json");
// Reads DIR/config.json and, when present, DIR/generation_config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// RoPE inverse frequencies (head_dim / 2 of them) as transformers computes them: in fp32, then
// rounded to the checkpoint's dtype, because transformers keeps them in a buffer that is cast with
// the model (a bf16 checkpoint runs with bf16-rounded frequencies even when the maths is fp32;
// ignoring this moves logits by ~1e-3 relative per hundred positions).
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace tailserve
