#include "worker/backends/cpu/cpu_engine.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine/sampling.h"
#include "common/block_hash.h"

namespace tailserve {
namespace {

// y[rows, out] = x[rows, in] · w[out, in]ᵀ (+ bias): the layout of HF nn.Linear weights.
void Linear(const float* x, int64_t rows, int64_t in, const std::vector<float>& w, int64_t out, const std::vector<float>* bias,
            float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(out), static_cast<int>(in),
              1.0f, x, static_cast<int>(in), w.data(), static_cast<int>(in), 0.0f, y, static_cast<int>(out));
  if (bias && !bias->empty()) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += (*bias)[o];
    }
  }
}

// HF LlamaRMSNorm in fp32: x / sqrt(mean(x²) + eps) * weight.
void RmsNorm(const float* x, int64_t rows, int64_t dim, const std::vector<float>& w, double eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = w[i] * (xr[i] * inv);
  }
}

// Rotate-half RoPE (HF convention: dimension i pairs with i + head_dim/2), in place on one row.
void ApplyRope(float* x, int64_t heads, int64_t head_dim, int64_t pos, const std::vector<float>& inv_freq) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];  // fp32 product, as transformers does
    const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
    const float s = static_cast<float>(std::sin(static_cast<double>(angle)));
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * head_dim;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Load(const std::string& dir, const CpuEngineOptions& options) {
  if (options.threads > 0) openblas_set_num_threads(options.threads);
  TAILSERVE_ASSIGN_OR_RETURN(const Checkpoint ckpt, LoadCheckpoint(dir));
  std::unique_ptr<CpuEngine> e(new CpuEngine());
  e->config_ = ckpt.config;
  e->options_ = options;
  e->model_id_ = std::filesystem::path(dir).lexically_normal().filename().string();
  if (e->model_id_.empty()) e->model_id_ = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  TAILSERVE_RETURN_IF_ERROR(e->LoadWeights(ckpt));
  e->rope_inv_freq_ = RopeInverseFrequencies(e->config_);
  const ModelConfig& c = e->config_;
  const int64_t block_bytes = 2 * c.num_layers * kBlockSize * c.kv_dim() * static_cast<int64_t>(sizeof(float));
  const int64_t max_blocks_per_seq = (c.max_position + kBlockSize - 1) / kBlockSize;
  const int64_t blocks = std::max<int64_t>(2, options.kv_cache_bytes / block_bytes);
  std::optional<uint64_t> salt;
  if (options.prefix_caching) {
    salt = BlockHashSalt(std::string_view(absl::StrCat("cpu|", e->model_id_, "|", c.vocab_size, "|", c.num_layers, "|",
                                                       options.kv_emulation ? KvDtypeName(*options.kv_emulation) : "fp32")));
  }
  e->blocks_ = std::make_unique<KvBlockAllocator>(blocks + 1, kBlockSize,
                                                  static_cast<int>(std::min<int64_t>(max_blocks_per_seq, 1 << 30)), 0,
                                                  c.max_position, std::span<int32_t>(), salt);
  e->k_pool_.resize(static_cast<size_t>(c.num_layers));
  e->v_pool_.resize(static_cast<size_t>(c.num_layers));
  return e;
}

absl::StatusOr<int32_t> CpuEngine::AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens) {
  if (!blocks_->prefix_caching()) return 0;
  TAILSERVE_ASSIGN_OR_RETURN(const int64_t hit, blocks_->AttachCachedPrefix(id, tokens));
  return static_cast<int32_t>(hit);
}

std::optional<EngineStats> CpuEngine::stats() const {
  EngineStats s;
  s.kv_blocks_total = blocks_->usable_blocks();
  s.kv_blocks_free = blocks_->unpromised_blocks();
  s.kv_blocks_cached = blocks_->cached_blocks();
  s.kv_evictions = blocks_->evictions();
  return s;
}

absl::Status CpuEngine::LoadWeights(const Checkpoint& ckpt) {
  const ModelConfig& c = config_;
  const TensorStore& t = ckpt.tensors;
  const int64_t h = c.hidden_size, ffn = c.intermediate_size;
  auto read = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float>* out) {
    return t.ReadFloat(name, shape, out);
  };
#define READ(name, shape, out) TAILSERVE_RETURN_IF_ERROR(read(name, shape, out))
  READ("model.embed_tokens.weight", (std::vector<int64_t>{c.vocab_size, h}), &embed_);
  READ("model.norm.weight", (std::vector<int64_t>{h}), &final_norm_);
  if (!c.tie_word_embeddings) READ("lm_head.weight", (std::vector<int64_t>{c.vocab_size, h}), &lm_head_);
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    auto name = [&](const char* suffix) { return LayerTensorName(l, suffix); };
    READ(name("input_layernorm.weight"), (std::vector<int64_t>{h}), &L.attn_norm);
    READ(name("post_attention_layernorm.weight"), (std::vector<int64_t>{h}), &L.mlp_norm);
    READ(name("self_attn.q_proj.weight"), (std::vector<int64_t>{c.q_dim(), h}), &L.wq);
    READ(name("self_attn.k_proj.weight"), (std::vector<int64_t>{c.kv_dim(), h}), &L.wk);
    READ(name("self_attn.v_proj.weight"), (std::vector<int64_t>{c.kv_dim(), h}), &L.wv);
    READ(name("self_attn.o_proj.weight"), (std::vector<int64_t>{h, c.q_dim()}), &L.wo);
    if (c.qkv_bias) {
      READ(name("self_attn.q_proj.bias"), (std::vector<int64_t>{c.q_dim()}), &L.bq);
      READ(name("self_attn.k_proj.bias"), (std::vector<int64_t>{c.kv_dim()}), &L.bk);
      READ(name("self_attn.v_proj.bias"), (std::vector<int64_t>{c.kv_dim()}), &L.bv);
    }
    if (c.o_bias) READ(name("self_attn.o_proj.bias"), (std::vector<int64_t>{h}), &L.bo);
    if (c.num_experts > 0) {
      READ(name("block_sparse_moe.gate.weight"), (std::vector<int64_t>{c.num_experts, h}), &L.router);
      L.experts.resize(static_cast<size_t>(c.num_experts));
      for (int64_t x = 0; x < c.num_experts; ++x) {
        READ(ExpertTensorName(l, x, "w1"), (std::vector<int64_t>{ffn, h}), &L.experts[x].w1);
        READ(ExpertTensorName(l, x, "w2"), (std::vector<int64_t>{h, ffn}), &L.experts[x].w2);
        READ(ExpertTensorName(l, x, "w3"), (std::vector<int64_t>{ffn, h}), &L.experts[x].w3);
      }
    } else {
      READ(name("mlp.gate_proj.weight"), (std::vector<int64_t>{ffn, h}), &L.w_gate);
      READ(name("mlp.up_proj.weight"), (std::vector<int64_t>{ffn, h}), &L.w_up);
      READ(name("mlp.down_proj.weight"), (std::vector<int64_t>{h, ffn}), &L.w_down);
    }
  }
#undef READ
  return absl::OkStatus();
}

void CpuEngine::Attention(int64_t l, const std::vector<Row>& rows, const float* q, float* out) {
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, group = c.num_heads / c.num_kv_heads, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> scores;
  // Rows of one sequence are consecutive with consecutive positions: each such run is one GEMM per
  // head for Q·Kᵀ and one for P·V (a prefill gets matrix products, a decode token a vector one).
  for (size_t r0 = 0; r0 < rows.size();) {
    size_t r1 = r0 + 1;
    while (r1 < rows.size() && rows[r1].seq == rows[r0].seq) ++r1;
    const KvBlockAllocator::Sequence& seq = *rows[r0].seq;
    const int64_t m = static_cast<int64_t>(r1 - r0), pos0 = rows[r0].pos, end = pos0 + m;
    const int64_t lo0 = c.sliding_window > 0 ? std::max<int64_t>(0, pos0 - c.sliding_window + 1) : 0;
    const int64_t n = end - lo0;
    scores.resize(static_cast<size_t>(m * n));
    // The sequence's K/V rows [lo0, end), gathered from its blocks.
    k_run_.resize(static_cast<size_t>(n * kv_dim));
    v_run_.resize(k_run_.size());
    for (int64_t p = lo0; p < end; ++p) {
      std::copy_n(KvAt(k_pool_[l], seq, p), kv_dim, k_run_.data() + (p - lo0) * kv_dim);
      std::copy_n(KvAt(v_pool_[l], seq, p), kv_dim, v_run_.data() + (p - lo0) * kv_dim);
    }
    for (int64_t head = 0; head < c.num_heads; ++head) {
      const int64_t kvh = head / group;
      const float* qh = q + static_cast<int64_t>(r0) * q_dim + head * hd;
      const float* kh = k_run_.data() + kvh * hd;
      const float* vh = v_run_.data() + kvh * hd;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(hd), scale, qh, static_cast<int>(q_dim), kh, static_cast<int>(kv_dim), 0.0f,
                  scores.data(), static_cast<int>(n));
      for (int64_t i = 0; i < m; ++i) {
        // Causal (and sliding-window) mask: row i at position pos0 + i sees [lo, pos0 + i].
        const int64_t pos = pos0 + i;
        const int64_t lo = c.sliding_window > 0 ? std::max<int64_t>(0, pos - c.sliding_window + 1) : 0;
        float* si = scores.data() + i * n;
        float max = -INFINITY;
        for (int64_t j = lo - lo0; j <= pos - lo0; ++j) max = std::max(max, si[j]);
        double total = 0;
        for (int64_t j = 0; j < n; ++j) {
          const bool visible = j >= lo - lo0 && j <= pos - lo0;
          si[j] = visible ? std::exp(si[j] - max) : 0.0f;
          total += si[j];
        }
        const float inv_total = static_cast<float>(1.0 / total);
        for (int64_t j = 0; j < n; ++j) si[j] *= inv_total;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(hd),
                  static_cast<int>(n), 1.0f, scores.data(), static_cast<int>(n), vh, static_cast<int>(kv_dim), 0.0f,
                  out + static_cast<int64_t>(r0) * q_dim + head * hd, static_cast<int>(q_dim));
    }
    r0 = r1;
  }
}

void CpuEngine::Mlp(const Layer& L, int64_t rows, const float* x, float* out) {
  const int64_t h = config_.hidden_size, ffn = config_.intermediate_size;
  if (config_.num_experts == 0) {
    std::vector<float> gate(static_cast<size_t>(rows * ffn)), up(static_cast<size_t>(rows * ffn));
    Linear(x, rows, h, L.w_gate, ffn, nullptr, gate.data());
    Linear(x, rows, h, L.w_up, ffn, nullptr, up.data());
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = Silu(gate[i]) * up[i];
    Linear(gate.data(), rows, ffn, L.w_down, h, nullptr, out);
    return;
  }
  // Mixtral: softmax over all experts, keep the top k, renormalise their weights to sum to one.
  const int64_t E = config_.num_experts, K = config_.experts_per_token;
  std::vector<float> logits(static_cast<size_t>(rows * E));
  Linear(x, rows, h, L.router, E, nullptr, logits.data());
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));  // (row, weight)
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t r = 0; r < rows; ++r) {
    float* lr = logits.data() + r * E;
    const float max = *std::max_element(lr, lr + E);
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += std::exp(static_cast<double>(lr[e] - max));
    std::vector<float> prob(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) prob[e] = static_cast<float>(std::exp(static_cast<double>(lr[e] - max)) / total);
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    // Highest probability first, lower index on ties (torch.topk order).
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return prob[a] > prob[b]; });
    if (K < E) {
      const float gap = lr[order[K - 1]] - lr[order[K]];
      if (r >= static_cast<int64_t>(router_margins_.size())) router_margins_.resize(static_cast<size_t>(r + 1), INFINITY);
      router_margins_[r] = std::min(router_margins_[r], gap);
    }
    float kept = 0;
    for (int64_t k = 0; k < K; ++k) kept += prob[order[k]];
    for (int64_t k = 0; k < K; ++k) routed[order[k]].emplace_back(r, prob[order[k]] / kept);
  }
  std::fill(out, out + rows * h, 0.0f);
  std::vector<float> xs, gate, up, down;
  for (int64_t e = 0; e < E; ++e) {
    const auto& sel = routed[e];
    if (sel.empty()) continue;
    const int64_t n = static_cast<int64_t>(sel.size());
    xs.resize(static_cast<size_t>(n * h));
    for (int64_t i = 0; i < n; ++i) std::copy_n(x + sel[i].first * h, h, xs.data() + i * h);
    gate.resize(static_cast<size_t>(n * ffn));
    up.resize(static_cast<size_t>(n * ffn));
    down.resize(static_cast<size_t>(n * h));
    Linear(xs.data(), n, h, L.experts[e].w1, ffn, nullptr, gate.data());
    Linear(xs.data(), n, h, L.experts[e].w3, ffn, nullptr, up.data());
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = Silu(gate[i]) * up[i];
    Linear(gate.data(), n, ffn, L.experts[e].w2, h, nullptr, down.data());
    for (int64_t i = 0; i < n; ++i) {
      float* o = out + sel[i].first * h;
      for (int64_t d = 0; d < h; ++d) o[d] += sel[i].second * down[i * h + d];
    }
  }
}

absl::Status CpuEngine::Forward(std::span<const StepSequence> batch, bool all_positions, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  router_margins_.clear();
  std::vector<Row> rows;
  std::vector<int32_t> row_tokens;
  std::vector<int64_t> last_row;  // per sequence: its last new row
  std::vector<KvBlockAllocator::Sequence*> seqs;
  for (const StepSequence& s : batch) {
    TAILSERVE_RETURN_IF_ERROR(CheckChunk(s));
    const int64_t n = s.chunk() ? s.end : static_cast<int64_t>(s.tokens->size());
    if (n > c.max_position) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", s.id, ": ", n, " tokens exceed the model's context of ",
                                                c.max_position));
    }
    TAILSERVE_ASSIGN_OR_RETURN(KvBlockAllocator::Sequence * kv, blocks_->Acquire(s.id));
    // The scheduler's `computed` is the truth; a longer cache (a sequence re-admitted under the
    // same id) is cut back to it, a shorter one is caught up by processing more tokens.
    kv->cached = std::min<int64_t>(kv->cached, s.computed);
    if (kv->cached >= n) kv->cached = n - 1;  // always run at least the last token
    const size_t held = kv->blocks.size();
    TAILSERVE_RETURN_IF_ERROR(blocks_->EnsurePositions(*kv, n));
    // Only blocks taken now can lie past the pools (held ones were written, so are inside).
    if (kv->blocks.size() > held) {
      const int64_t top = *std::max_element(kv->blocks.begin() + static_cast<std::ptrdiff_t>(held), kv->blocks.end()) + 1;
      const size_t need = static_cast<size_t>(top * kBlockSize * c.kv_dim());
      for (int64_t l = 0; l < c.num_layers; ++l) {
        if (k_pool_[l].size() < need) k_pool_[l].resize(need), v_pool_[l].resize(need);
      }
    }
    seqs.push_back(kv);
    for (int64_t p = kv->cached; p < n; ++p) {
      const int32_t tok = (*s.tokens)[p];
      if (tok < 0 || tok >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s.id, ": token id ", tok, " outside the vocabulary"));
      }
      rows.push_back({kv, p});
      row_tokens.push_back(tok);
    }
    last_row.push_back(static_cast<int64_t>(rows.size()) - 1);
  }
  const int64_t T = static_cast<int64_t>(rows.size());
  std::vector<float> x(static_cast<size_t>(T * h)), xn(x.size()), tmp(x.size());
  for (int64_t r = 0; r < T; ++r) std::copy_n(embed_.data() + row_tokens[r] * h, h, x.data() + r * h);
  std::vector<float> q(static_cast<size_t>(T * c.q_dim())), k(static_cast<size_t>(T * c.kv_dim())), v(k.size());
  std::vector<float> attn(q.size());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    RmsNorm(x.data(), T, h, L.attn_norm, c.rms_norm_eps, xn.data());
    Linear(xn.data(), T, h, L.wq, c.q_dim(), &L.bq, q.data());
    Linear(xn.data(), T, h, L.wk, c.kv_dim(), &L.bk, k.data());
    Linear(xn.data(), T, h, L.wv, c.kv_dim(), &L.bv, v.data());
    for (int64_t r = 0; r < T; ++r) {
      ApplyRope(q.data() + r * c.q_dim(), c.num_heads, c.head_dim, rows[r].pos, rope_inv_freq_);
      ApplyRope(k.data() + r * c.kv_dim(), c.num_kv_heads, c.head_dim, rows[r].pos, rope_inv_freq_);
      if (options_.kv_emulation) {
        for (int64_t head = 0; head < c.num_kv_heads; ++head) {
          QuantizeKvHead(*options_.kv_emulation, k.data() + r * c.kv_dim() + head * c.head_dim, c.head_dim);
          QuantizeKvHead(*options_.kv_emulation, v.data() + r * c.kv_dim() + head * c.head_dim, c.head_dim);
        }
      }
      std::copy_n(k.data() + r * c.kv_dim(), c.kv_dim(), KvAt(k_pool_[l], *rows[r].seq, rows[r].pos));
      std::copy_n(v.data() + r * c.kv_dim(), c.kv_dim(), KvAt(v_pool_[l], *rows[r].seq, rows[r].pos));
    }
    Attention(l, rows, q.data(), attn.data());
    Linear(attn.data(), T, c.q_dim(), L.wo, h, &L.bo, tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    RmsNorm(x.data(), T, h, L.mlp_norm, c.rms_norm_eps, xn.data());
    Mlp(L, T, xn.data(), tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    KvBlockAllocator::Sequence& kv = *seqs[i];
    kv.cached = std::max<int64_t>(kv.cached, batch[i].computed_after());
    blocks_->PublishComputed(kv, *batch[i].tokens, kv.cached);
  }

  // Only the rows whose logits are wanted go through the final norm and the LM head.
  std::vector<int64_t> out_rows;
  if (all_positions) {
    for (int64_t r = 0; r < T; ++r) out_rows.push_back(r);
  } else {
    out_rows = last_row;
  }
  const int64_t R = static_cast<int64_t>(out_rows.size());
  std::vector<float> sel(static_cast<size_t>(R * h));
  for (int64_t i = 0; i < R; ++i) std::copy_n(x.data() + out_rows[i] * h, h, sel.data() + i * h);
  RmsNorm(sel.data(), R, h, final_norm_, c.rms_norm_eps, sel.data());
  logits->resize(static_cast<size_t>(R * c.vocab_size));
  Linear(sel.data(), R, h, c.tie_word_embeddings ? embed_ : lm_head_, c.vocab_size, nullptr, logits->data());
  return absl::OkStatus();
}

absl::Status CpuEngine::Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) {
  std::vector<float> logits;
  TAILSERVE_RETURN_IF_ERROR(Forward(batch, /*all_positions=*/false, &logits));
  next->resize(batch.size());
  const int64_t vocab = config_.vocab_size;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].chunk()) {
      (*next)[i] = -1;
      continue;
    }
    std::span<const float> row(logits.data() + static_cast<int64_t>(i) * vocab, static_cast<size_t>(vocab));
    (*next)[i] = SampleToken(row, *batch[i].sampling, static_cast<int64_t>(batch[i].tokens->size()), &sample_scratch_);
    if (batch[i].logprobs) ComputeLogprobs(row, (*next)[i], batch[i].sampling->top_logprobs, batch[i].logprobs);
  }
  return absl::OkStatus();
}

}  // namespace tailserve
