#include "worker/backends/cuda/weights.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"

namespace tailserve::cuda {
namespace {

// fp16 bits of a checkpoint tensor. Matrices run as fp16 (not bf16): 3 more mantissa bits in the
// activations that feed every GEMM keep the logits within 1e-2 of fp32 maths (bf16 activations
// measured 1.1-1.5e-2 on the reference models); bf16 weights convert exactly unless they leave
// fp16's range, which is refused rather than silently clamped.
absl::Status ToHalf(const TensorInfo& t, std::vector<uint16_t>* out) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> f(n);
  ToFloat(t.dtype, t.data, n, f.data());
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(f[i]) > 65504.0f) {
      return absl::OutOfRangeError(absl::StrCat(t.file, ": tensor ", t.name, " holds ", f[i],
                                                ", outside the fp16 range the CUDA backend computes in"));
    }
    const __half h = __float2half_rn(f[i]);
    std::memcpy(&(*out)[i], &h, 2);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadModelWeights(const Checkpoint& ckpt) {
  const ModelConfig& c = ckpt.config;
  ModelWeights w;
  const TensorStore& t = ckpt.tensors;
  // One allocation holds every weight: matrices in fp16, norms and biases in fp32.
  size_t exact = static_cast<size_t>(c.head_dim) * 4 + 256;  // + the RoPE frequencies
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const bool fp32 = spec.shape.size() == 1 || spec.name.find("block_sparse_moe.gate.") != std::string::npos;
    exact += static_cast<size_t>(n) * (fp32 ? 4 : 2) + 256;
  }
  // Tied embeddings: the LM head is a copy of the table with the final norm's weight folded in.
  if (c.tie_word_embeddings) exact += static_cast<size_t>(c.vocab_size * c.hidden_size) * 2 + 256;
  TAILSERVE_ASSIGN_OR_RETURN(w.memory, DeviceAlloc(exact));
  w.bytes = exact;
  DeviceArena arena(w.memory.get(), exact);

  std::vector<uint16_t> host;
  std::vector<float> hostf;
  // Copies tensors (concatenated along their first dimension) into one fp16 device matrix. With
  // col_scale, column j of every tensor is multiplied by col_scale[j] first (an RMSNorm weight
  // folded into its consumer); with interleave (two tensors of equal shape), their rows alternate.
  auto matrix = [&](std::vector<std::string> names, std::vector<std::vector<int64_t>> shapes, const __half** out,
                    const std::vector<float>* col_scale = nullptr, bool interleave = false) -> absl::Status {
    int64_t total = 0;
    for (auto& s : shapes) total += s[0] * s[1];
    auto* dst = arena.Take<__half>(static_cast<size_t>(total));
    if (col_scale == nullptr && !interleave) {
      int64_t at = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        TAILSERVE_ASSIGN_OR_RETURN(const TensorInfo* info, t.Get(names[i], shapes[i]));
        TAILSERVE_RETURN_IF_ERROR(ToHalf(*info, &host));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst + at, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
        at += static_cast<int64_t>(host.size());
      }
      *out = dst;
      return absl::OkStatus();
    }
    host.resize(static_cast<size_t>(total));
    int64_t first_row = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      TAILSERVE_RETURN_IF_ERROR(t.ReadFloat(names[i], shapes[i], &hostf));
      const int64_t rows = shapes[i][0], cols = shapes[i][1];
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t dst_row = interleave ? 2 * r + static_cast<int64_t>(i) : first_row + r;
        for (int64_t j = 0; j < cols; ++j) {
          const float v =
              hostf[static_cast<size_t>(r * cols + j)] * (col_scale ? (*col_scale)[static_cast<size_t>(j)] : 1.0f);
          if (std::fabs(v) > 65504.0f) {
            return absl::OutOfRangeError(absl::StrCat(names[i], " times its norm weight holds ", v,
                                                      ", outside the fp16 range the CUDA backend computes in"));
          }
          const __half hv = __float2half_rn(v);
          std::memcpy(&host[static_cast<size_t>(dst_row * cols + j)], &hv, 2);
        }
      }
      first_row += rows;
    }
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    *out = dst;
    return absl::OkStatus();
  };
  // fp32 tensors (norms, biases, the MoE router), concatenated; `shape` when not one-dimensional.
  auto vector = [&](std::vector<std::string> names, std::vector<int64_t> sizes, const float** out,
                    std::vector<int64_t> shape = {}) -> absl::Status {
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    auto* dst = arena.Take<float>(static_cast<size_t>(total));
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::vector<int64_t> want = shape.empty() ? std::vector<int64_t>{sizes[i]} : shape;
      TAILSERVE_RETURN_IF_ERROR(t.ReadFloat(names[i], want, &hostf));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst + at, hostf.data(), hostf.size() * 4, cudaMemcpyHostToDevice));
      at += sizes[i];
    }
    *out = dst;
    return absl::OkStatus();
  };
  const int64_t h = c.hidden_size, f = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  TAILSERVE_RETURN_IF_ERROR(matrix({"model.embed_tokens.weight"}, {{c.vocab_size, h}}, &w.embed));
  // The final norm's weight is folded into the LM head like the layers' norms, so at batch 1 the
  // LM head Gemv normalises in its epilogue and the step has no norm kernel before it.
  std::vector<float> final_gamma;
  TAILSERVE_RETURN_IF_ERROR(t.ReadFloat("model.norm.weight", std::vector<int64_t>{h}, &final_gamma));
  TAILSERVE_RETURN_IF_ERROR(matrix({c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"},
                                   {{c.vocab_size, h}}, &w.lm_head, &final_gamma));
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w.layers[l];
    auto n = [&](const char* suffix) { return LayerTensorName(l, suffix); };
    // The norms' weights are folded into the matrices that consume the normed rows.
    std::vector<float> attn_gamma, mlp_gamma;
    TAILSERVE_RETURN_IF_ERROR(t.ReadFloat(n("input_layernorm.weight"), std::vector<int64_t>{h}, &attn_gamma));
    TAILSERVE_RETURN_IF_ERROR(t.ReadFloat(n("post_attention_layernorm.weight"), std::vector<int64_t>{h}, &mlp_gamma));
    TAILSERVE_RETURN_IF_ERROR(
        matrix({n("self_attn.q_proj.weight"), n("self_attn.k_proj.weight"), n("self_attn.v_proj.weight")},
               {{qd, h}, {kvd, h}, {kvd, h}}, &L.w_qkv, &attn_gamma));
    if (c.qkv_bias) {
      TAILSERVE_RETURN_IF_ERROR(
          vector({n("self_attn.q_proj.bias"), n("self_attn.k_proj.bias"), n("self_attn.v_proj.bias")}, {qd, kvd, kvd},
                 &L.b_qkv));
    }
    TAILSERVE_RETURN_IF_ERROR(matrix({n("self_attn.o_proj.weight")}, {{h, qd}}, &L.w_o));
    if (c.o_bias) TAILSERVE_RETURN_IF_ERROR(vector({n("self_attn.o_proj.bias")}, {h}, &L.b_o));
    if (c.num_experts > 0) {
      TAILSERVE_RETURN_IF_ERROR(vector({n("post_attention_layernorm.weight")}, {h},
                                       &L.mlp_norm));  // the router reads the normed rows in fp32
      TAILSERVE_RETURN_IF_ERROR(
          vector({n("block_sparse_moe.gate.weight")}, {c.num_experts * h}, &L.w_router, {c.num_experts, h}));
      L.expert_gate_up.resize(static_cast<size_t>(c.num_experts));
      L.expert_down.resize(static_cast<size_t>(c.num_experts));
      for (int64_t e = 0; e < c.num_experts; ++e) {
        TAILSERVE_RETURN_IF_ERROR(matrix({ExpertTensorName(l, e, "w1"), ExpertTensorName(l, e, "w3")}, {{f, h}, {f, h}},
                                         &L.expert_gate_up[e], &mlp_gamma, /*interleave=*/true));
        TAILSERVE_RETURN_IF_ERROR(matrix({ExpertTensorName(l, e, "w2")}, {{h, f}}, &L.expert_down[e]));
      }
    } else {
      TAILSERVE_RETURN_IF_ERROR(matrix({n("mlp.gate_proj.weight"), n("mlp.up_proj.weight")}, {{f, h}, {f, h}},
                                       &L.w_gate_up, &mlp_gamma,
                                       /*interleave=*/true));
      TAILSERVE_RETURN_IF_ERROR(matrix({n("mlp.down_proj.weight")}, {{h, f}}, &L.w_down));
    }
  }
  const std::vector<float> inv = RopeInverseFrequencies(c);
  auto* inv_dev = arena.Take<float>(inv.size());
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_dev, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  w.inv_freq = inv_dev;
  return w;
}

int64_t ModelWeights::LayerStrideBytes() const {
  if (layers.size() < 2 || layers[0].w_qkv == nullptr) return 0;
  auto at = [](const void* p) { return reinterpret_cast<intptr_t>(p); };
  const LayerWeights& first = layers[0];
  const int64_t stride = at(layers[1].w_qkv) - at(first.w_qkv);
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& L = layers[l];
    const int64_t offset = static_cast<int64_t>(l) * stride;
    if (at(L.w_qkv) - at(first.w_qkv) != offset || at(L.w_o) - at(first.w_o) != offset ||
        at(L.w_gate_up) - at(first.w_gate_up) != offset || at(L.w_down) - at(first.w_down) != offset) {
      return 0;
    }
  }
  return stride;
}

}  // namespace tailserve::cuda
