#include "common/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tailserve {
namespace {

// f rounded to fp16's precision and range (nearest, ties to even), as a conversion to _Float16
// and back does; portable to compilers without _Float16 (clang 14 on x86).
float RoundToHalf(float f) {
  if (!std::isfinite(f) || f == 0) return f;
  const float a = std::fabs(f);
  // fp16: 10 mantissa bits; subnormals below 2^-14 step by 2^-24.
  const int e = std::max(std::ilogb(a), -14);
  const float quantum = std::ldexp(1.0f, e - 10);
  const float r = std::nearbyint(a / quantum) * quantum;
  return std::copysign(r >= 65520.0f ? INFINITY : r, f);
}

using nlohmann::json;

struct Reader {
  const json& j;
  const std::string& source;

  absl::Status Missing(const std::string& key) const {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, " is missing"));
  }
  absl::Status Wrong(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, " ", what));
  }
  bool Has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }

  absl::Status Int(const std::string& key, int64_t* out, bool required = true, int64_t min = 1) const {
    if (!Has(key)) return required ? Missing(key) : absl::OkStatus();
    if (!j[key].is_number_integer()) return Wrong(key, "must be an integer");
    *out = j[key].get<int64_t>();
    if (*out < min) return Wrong(key, absl::StrCat("must be >= ", min, ", got ", *out));
    return absl::OkStatus();
  }
  absl::Status Num(const std::string& key, double* out, bool required = true) const {
    if (!Has(key)) return required ? Missing(key) : absl::OkStatus();
    if (!j[key].is_number()) return Wrong(key, "must be a number");
    *out = j[key].get<double>();
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& key, bool* out) const {
    if (!Has(key)) return absl::OkStatus();
    if (!j[key].is_boolean()) return Wrong(key, "must be true or false");
    *out = j[key].get<bool>();
    return absl::OkStatus();
  }
};

absl::Status ParseRope(const json& params, const std::string& source, const std::string& prefix, RopeConfig* rope) {
  Reader r{params, source};
  TAILSERVE_RETURN_IF_ERROR(r.Num("rope_theta", &rope->theta, false));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {  // transformers 4 wrote "type" in older checkpoints
    if (r.Has(key)) {
      if (!params[key].is_string()) return r.Wrong(prefix + key, "must be a string");
      type = params[key].get<std::string>();
      break;
    }
  }
  if (type == "default") {
    rope->type = RopeConfig::Type::kDefault;
    return absl::OkStatus();
  }
  if (type == "linear") {
    rope->type = RopeConfig::Type::kLinear;
    return r.Num("factor", &rope->factor);
  }
  if (type == "llama3") {
    rope->type = RopeConfig::Type::kLlama3;
    TAILSERVE_RETURN_IF_ERROR(r.Num("factor", &rope->factor));
    TAILSERVE_RETURN_IF_ERROR(r.Num("low_freq_factor", &rope->low_freq_factor));
    TAILSERVE_RETURN_IF_ERROR(r.Num("high_freq_factor", &rope->high_freq_factor));
    TAILSERVE_RETURN_IF_ERROR(r.Int("original_max_position_embeddings", &rope->original_max_position));
    if (rope->high_freq_factor <= rope->low_freq_factor) {
      return r.Wrong(prefix + "high_freq_factor", "must be greater than low_freq_factor");
    }
    return absl::OkStatus();
  }
  return r.Wrong(prefix + "rope_type", absl::StrCat("\"", type, "\" is not supported (default, linear, llama3)"));
}

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(source + ": not a JSON object");
  return j;
}

absl::StatusOr<std::vector<int32_t>> IdList(const json& v, const std::string& source, const std::string& key) {
  std::vector<int32_t> ids;
  if (v.is_null()) return ids;
  if (v.is_number_integer()) return std::vector<int32_t>{v.get<int32_t>()};
  if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_number_integer()) return absl::InvalidArgumentError(source + ": " + key + " must hold integers");
      ids.push_back(e.get<int32_t>());
    }
    return ids;
  }
  return absl::InvalidArgumentError(source + ": " + key + " must be an integer or a list of integers");
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

const char* ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama: return "LlamaForCausalLM";
    case Architecture::kQwen2: return "Qwen2ForCausalLM";
    case Architecture::kMistral: return "MistralForCausalLM";
    case Architecture::kMixtral: return "MixtralForCausalLM";
  }
  return "?";
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  TAILSERVE_ASSIGN_OR_RETURN(const json j, ParseJson(json_text, source));
  Reader r{j, source};
  ModelConfig c;

  std::string arch;
  if (r.Has("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    arch = j["architectures"][0].get<std::string>();
  } else if (r.Has("model_type") && j["model_type"].is_string()) {
    const std::string mt = j["model_type"].get<std::string>();
    arch = mt == "llama" ? "LlamaForCausalLM" : mt == "qwen2" ? "Qwen2ForCausalLM" : mt == "mistral" ? "MistralForCausalLM"
         : mt == "mixtral" ? "MixtralForCausalLM" : mt;
  } else {
    return r.Missing("architectures");
  }
  bool found = false;
  for (Architecture a : {Architecture::kLlama, Architecture::kQwen2, Architecture::kMistral, Architecture::kMixtral}) {
    if (arch == ArchitectureName(a)) c.arch = a, found = true;
  }
  if (!found) {
    return r.Wrong("architectures", absl::StrCat("\"", arch, "\" is not supported (LlamaForCausalLM, Qwen2ForCausalLM, ",
                                                  "MistralForCausalLM, MixtralForCausalLM)"));
  }

  TAILSERVE_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size));
  TAILSERVE_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size));
  TAILSERVE_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size));
  TAILSERVE_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_layers));
  TAILSERVE_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  TAILSERVE_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.num_kv_heads, false));
  if (c.num_heads % c.num_kv_heads != 0) {
    return r.Wrong("num_key_value_heads", absl::StrCat(c.num_kv_heads, " does not divide num_attention_heads ", c.num_heads));
  }
  c.head_dim = c.hidden_size / c.num_heads;
  TAILSERVE_RETURN_IF_ERROR(r.Int("head_dim", &c.head_dim, false));
  if (c.head_dim % 2 != 0) return r.Wrong("head_dim", "must be even for RoPE");
  c.max_position = 2048;
  TAILSERVE_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c.max_position, false));
  TAILSERVE_RETURN_IF_ERROR(r.Num("rms_norm_eps", &c.rms_norm_eps, false));
  TAILSERVE_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));

  if (r.Has("hidden_act") && j["hidden_act"] != "silu") return r.Wrong("hidden_act", "must be \"silu\"");
  bool mlp_bias = false;
  TAILSERVE_RETURN_IF_ERROR(r.Bool("mlp_bias", &mlp_bias));
  if (mlp_bias) return r.Wrong("mlp_bias", "true is not supported");
  if (c.arch == Architecture::kQwen2) {
    c.qkv_bias = true;
  } else if (c.arch == Architecture::kLlama) {
    bool attention_bias = false;
    TAILSERVE_RETURN_IF_ERROR(r.Bool("attention_bias", &attention_bias));
    c.qkv_bias = c.o_bias = attention_bias;
  }

  // RoPE: transformers 5 nests it in rope_parameters; transformers 4 has rope_theta + rope_scaling.
  if (r.Has("rope_parameters")) {
    if (!j["rope_parameters"].is_object()) return r.Wrong("rope_parameters", "must be an object");
    TAILSERVE_RETURN_IF_ERROR(ParseRope(j["rope_parameters"], source, "rope_parameters.", &c.rope));
  } else {
    TAILSERVE_RETURN_IF_ERROR(r.Num("rope_theta", &c.rope.theta, false));
    if (r.Has("rope_scaling")) {
      if (!j["rope_scaling"].is_object()) return r.Wrong("rope_scaling", "must be an object or null");
      const double theta = c.rope.theta;
      TAILSERVE_RETURN_IF_ERROR(ParseRope(j["rope_scaling"], source, "rope_scaling.", &c.rope));
      c.rope.theta = theta;
    }
  }

  if (c.arch == Architecture::kMixtral) {
    TAILSERVE_RETURN_IF_ERROR(r.Int("num_local_experts", &c.num_experts));
    TAILSERVE_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.experts_per_token));
    if (c.experts_per_token > c.num_experts) {
      return r.Wrong("num_experts_per_tok", absl::StrCat("exceeds num_local_experts ", c.num_experts));
    }
  }
  // Sliding-window attention: Mistral/Mixtral when set; Qwen2 only with use_sliding_window.
  if (c.arch == Architecture::kMistral || c.arch == Architecture::kMixtral) {
    TAILSERVE_RETURN_IF_ERROR(r.Int("sliding_window", &c.sliding_window, false));
  } else if (c.arch == Architecture::kQwen2) {
    bool use = false;
    TAILSERVE_RETURN_IF_ERROR(r.Bool("use_sliding_window", &use));
    if (use) return r.Wrong("use_sliding_window", "true is not supported");
  }

  if (r.Has("eos_token_id")) {
    TAILSERVE_ASSIGN_OR_RETURN(c.eos_token_ids, IdList(j["eos_token_id"], source, "eos_token_id"));
  }
  if (r.Has("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int32_t>();
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!r.Has(key)) continue;
    const std::string d = j[key].is_string() ? j[key].get<std::string>() : "";
    if (d == "bfloat16") c.dtype = DType::kBF16;
    else if (d == "float16") c.dtype = DType::kF16;
    else if (d == "float32") c.dtype = DType::kF32;
    else return r.Wrong(key, "must be bfloat16, float16 or float32");
    break;
  }
  return c;
}

absl::Status ApplyGenerationConfig(const std::string& json_text, ModelConfig* config, const std::string& source) {
  TAILSERVE_ASSIGN_OR_RETURN(const json j, ParseJson(json_text, source));
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    TAILSERVE_ASSIGN_OR_RETURN(config->eos_token_ids, IdList(j["eos_token_id"], source, "eos_token_id"));
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) config->bos_token_id = j["bos_token_id"].get<int32_t>();
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  TAILSERVE_ASSIGN_OR_RETURN(const std::string text, ReadFile((fs::path(dir) / "config.json").string()));
  TAILSERVE_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text, "config.json"));
  const fs::path gen = fs::path(dir) / "generation_config.json";
  if (fs::exists(gen)) {
    TAILSERVE_ASSIGN_OR_RETURN(const std::string g, ReadFile(gen.string()));
    TAILSERVE_RETURN_IF_ERROR(ApplyGenerationConfig(g, &config));
  }
  for (int32_t id : config.eos_token_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": eos_token_id ", id, " is outside the vocabulary of ",
                                                     config.vocab_size));
    }
  }
  return config;
}

std::vector<float> RopeInverseFrequencies(const ModelConfig& config) {
  const RopeConfig& rope = config.rope;
  const int64_t head_dim = config.head_dim;
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const float base = static_cast<float>(rope.theta);
  for (int64_t i = 0; i < half; ++i) {
    // fp32 like torch: base ** (arange(0, dim, 2).float() / dim)
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  if (rope.type == RopeConfig::Type::kLinear) {
    for (float& f : inv) f = static_cast<float>(f / rope.factor);
  } else if (rope.type == RopeConfig::Type::kLlama3) {
    const double old_len = static_cast<double>(rope.original_max_position);
    const double low_wavelen = old_len / rope.low_freq_factor;
    const double high_wavelen = old_len / rope.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rope.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / rope.factor + smooth * f);
      }
    }
  }
  for (float& f : inv) {
    if (config.dtype == DType::kBF16) {
      const uint32_t bits = static_cast<uint32_t>(FloatToBf16(f)) << 16;
      std::memcpy(&f, &bits, 4);
    } else if (config.dtype == DType::kF16) {
      f = RoundToHalf(f);
    }
  }
  return inv;
}

}  // namespace tailserve
