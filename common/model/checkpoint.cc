#include "common/model/checkpoint.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tailserve {

std::string LayerTensorName(int64_t layer, const std::string& suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

std::string ExpertTensorName(int64_t layer, int64_t expert, const char* w) {
  return absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.", expert, ".", w, ".weight");
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, ffn = c.intermediate_size;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto add = [&](const std::string& suffix, std::vector<int64_t> shape) { t.push_back({LayerTensorName(l, suffix), shape}); };
    add("input_layernorm.weight", {h});
    add("self_attn.q_proj.weight", {c.q_dim(), h});
    add("self_attn.k_proj.weight", {c.kv_dim(), h});
    add("self_attn.v_proj.weight", {c.kv_dim(), h});
    add("self_attn.o_proj.weight", {h, c.q_dim()});
    if (c.qkv_bias) {
      add("self_attn.q_proj.bias", {c.q_dim()});
      add("self_attn.k_proj.bias", {c.kv_dim()});
      add("self_attn.v_proj.bias", {c.kv_dim()});
    }
    if (c.o_bias) add("self_attn.o_proj.bias", {h});
    add("post_attention_layernorm.weight", {h});
    if (c.num_experts > 0) {
      add("block_sparse_moe.gate.weight", {c.num_experts, h});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        t.push_back({ExpertTensorName(l, e, "w1"), {ffn, h}});
        t.push_back({ExpertTensorName(l, e, "w2"), {h, ffn}});
        t.push_back({ExpertTensorName(l, e, "w3"), {ffn, h}});
      }
    } else {
      add("mlp.gate_proj.weight", {ffn, h});
      add("mlp.up_proj.weight", {ffn, h});
      add("mlp.down_proj.weight", {h, ffn});
    }
  }
  t.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}});
  return t;
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir) {
  TAILSERVE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  TAILSERVE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::Open(dir));
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    TAILSERVE_RETURN_IF_ERROR(store.Get(spec.name, spec.shape).status());
  }
  return Checkpoint{dir, std::move(config), std::move(store)};
}

}  // namespace tailserve
