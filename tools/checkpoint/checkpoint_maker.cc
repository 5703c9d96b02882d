#include "tools/checkpoint/checkpoint_maker.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/checkpoint.h"
#include "common/model/safetensors.h"
#include "common/splitmix.h"
#include "common/status_macros.h"

namespace tailserve {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Each tensor's values depend only on (seed, name), not on shard layout or write order.
uint64_t TensorSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool IsNorm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

absl::Status WriteTensor(SafetensorsWriter& w, const TensorSpec& t, uint64_t seed, float std) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  uint64_t state = TensorSeed(seed, t.name);
  const float scale = std * std::sqrt(3.0f) / static_cast<float>(1u << 23);  // uniform [-a, a], a = std·√3
  const uint16_t one = FloatToBf16(1.0f);
  std::vector<uint16_t> chunk;
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min<int64_t>(n - done, 1 << 20);
    chunk.resize(static_cast<size_t>(m));
    if (IsNorm(t.name)) {
      std::fill(chunk.begin(), chunk.end(), one);
    } else {
      for (int64_t i = 0; i < m; ++i) {
        const uint64_t r = SplitMixNext(state);
        const int32_t centred = static_cast<int32_t>(r >> 40) - (1 << 23);  // 24 random bits, centred
        chunk[i] = FloatToBf16(static_cast<float>(centred) * scale);
      }
    }
    TAILSERVE_RETURN_IF_ERROR(w.Write({reinterpret_cast<const std::byte*>(chunk.data()), chunk.size() * 2}));
    done += m;
  }
  return absl::OkStatus();
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path.string(), ": write failed"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name) {
  ModelConfig c;
  c.dtype = DType::kBF16;
  c.rms_norm_eps = 1e-5;
  if (name == "tiny") {  // the demo and CI model: small enough for 2 CPU cores
    c.hidden_size = 256, c.intermediate_size = 688, c.num_layers = 4, c.num_heads = 8, c.num_kv_heads = 2;
    c.head_dim = 32, c.max_position = 4096, c.rope.theta = 500000, c.tie_word_embeddings = true;
  } else if (name == "llama-3.2-1b") {
    c.hidden_size = 2048, c.intermediate_size = 8192, c.num_layers = 16, c.num_heads = 32, c.num_kv_heads = 8;
    c.head_dim = 64, c.max_position = 131072, c.tie_word_embeddings = true;
    c.rope = {.theta = 500000, .type = RopeConfig::Type::kLlama3, .factor = 32, .low_freq_factor = 1,
              .high_freq_factor = 4, .original_max_position = 8192};
  } else if (name == "llama-3.1-8b") {
    c.hidden_size = 4096, c.intermediate_size = 14336, c.num_layers = 32, c.num_heads = 32, c.num_kv_heads = 8;
    c.head_dim = 128, c.max_position = 131072;
    c.rope = {.theta = 500000, .type = RopeConfig::Type::kLlama3, .factor = 8, .low_freq_factor = 1,
              .high_freq_factor = 4, .original_max_position = 8192};
  } else if (name == "mixtral-tiny") {
    c.arch = Architecture::kMixtral;
    c.hidden_size = 192, c.intermediate_size = 384, c.num_layers = 3, c.num_heads = 6, c.num_kv_heads = 2;
    c.head_dim = 32, c.max_position = 4096, c.rope.theta = 1e6, c.num_experts = 4, c.experts_per_token = 2;
  } else if (name == "qwen2-tiny") {
    c.arch = Architecture::kQwen2;
    c.hidden_size = 192, c.intermediate_size = 512, c.num_layers = 3, c.num_heads = 6, c.num_kv_heads = 2;
    c.head_dim = 32, c.max_position = 4096, c.rope.theta = 1e6, c.qkv_bias = true, c.tie_word_embeddings = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("preset \"", name,
                                                   "\" is unknown (tiny, llama-3.2-1b, llama-3.1-8b, mixtral-tiny, qwen2-tiny)"));
  }
  return c;
}

std::string ConfigJson(const ModelConfig& c, const std::string& format) {
  static const char* kModelType[] = {"llama", "qwen2", "mistral", "mixtral"};
  json j;
  j["architectures"] = {ArchitectureName(c.arch)};
  j["model_type"] = kModelType[static_cast<int>(c.arch)];
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.arch == Architecture::kLlama) j["attention_bias"] = c.qkv_bias;
  if (c.num_experts) {
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.experts_per_token;
  }
  if (c.arch == Architecture::kMistral || c.arch == Architecture::kMixtral) {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  json rope;
  switch (c.rope.type) {
    case RopeConfig::Type::kDefault: break;
    case RopeConfig::Type::kLinear: rope = {{"rope_type", "linear"}, {"factor", c.rope.factor}}; break;
    case RopeConfig::Type::kLlama3:
      rope = {{"rope_type", "llama3"}, {"factor", c.rope.factor}, {"low_freq_factor", c.rope.low_freq_factor},
              {"high_freq_factor", c.rope.high_freq_factor},
              {"original_max_position_embeddings", c.rope.original_max_position}};
      break;
  }
  const char* dtype = c.dtype == DType::kBF16 ? "bfloat16" : c.dtype == DType::kF16 ? "float16" : "float32";
  if (format == "hf5") {
    if (rope.is_null()) rope = {{"rope_type", "default"}};
    rope["rope_theta"] = c.rope.theta;
    j["rope_parameters"] = rope;
    j["dtype"] = dtype;
  } else {
    j["rope_theta"] = c.rope.theta;
    j["rope_scaling"] = rope;
    j["torch_dtype"] = dtype;
  }
  return j.dump(2) + "\n";
}

absl::Status WriteCheckpoint(const CheckpointSpec& spec, const std::string& out_dir) {
  const ModelConfig& c = spec.config;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(out_dir, ": ", ec.message()));
  const fs::path dir(out_dir);

  // Shards: consecutive tensors until the next would pass shard_bytes.
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t bytes = 0, total = 0;
  for (TensorSpec& t : ExpectedTensors(c)) {
    uint64_t n = 2;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (bytes > 0 && bytes + n > spec.shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    bytes += n;
    total += n;
    shards.back().push_back(std::move(t));
  }
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? "model.safetensors"
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    std::vector<SafetensorsWriter::Entry> entries;
    for (const TensorSpec& t : shards[s]) {
      entries.push_back({t.name, DType::kBF16, t.shape});
      weight_map[t.name] = name;
    }
    TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> w,
                               SafetensorsWriter::Create((dir / name).string(), entries, {{"format", "pt"}}));
    for (const TensorSpec& t : shards[s]) {
      TAILSERVE_RETURN_IF_ERROR(WriteTensor(*w, t, spec.seed, spec.init_std));
    }
    TAILSERVE_RETURN_IF_ERROR(w->Close());
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    TAILSERVE_RETURN_IF_ERROR(WriteText(dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  }

  TAILSERVE_RETURN_IF_ERROR(WriteText(dir / "config.json", ConfigJson(c, spec.config_format)));
  json gen = {{"_from_model_config", true}};
  if (c.bos_token_id >= 0) gen["bos_token_id"] = c.bos_token_id;
  if (!c.eos_token_ids.empty()) gen["eos_token_id"] = c.eos_token_ids;
  TAILSERVE_RETURN_IF_ERROR(WriteText(dir / "generation_config.json", gen.dump(2) + "\n"));

  if (!spec.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      const fs::path src = fs::path(spec.tokenizer_dir) / f;
      if (!fs::exists(src)) continue;
      fs::copy_file(src, dir / f, fs::copy_options::overwrite_existing, ec);
      if (ec) return absl::InternalError(absl::StrCat(src.string(), ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tailserve
