#pragma once
// The CPU reference backend: fp32 maths over the checkpoint's weights (converted once at load),
// a paged KV cache (the CUDA engine's allocator and prefix caching, blocks of 16 positions held in
// per-layer pools that grow as blocks are first used), and every projection of a step done as one
// GEMM over all the tokens the step processes (prefill and decode tokens of many sequences
// together). It is what the faster backends are checked against, and what CI and the demo run.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "worker/engine/engine.h"
#include "worker/engine/kv_dtype.h"
#include "worker/kv/kv_block_allocator.h"

namespace tailserve {

struct CpuEngineOptions {
  int threads = 0;  // BLAS threads; 0 keeps the library's default
  // Emulate a KV cache format (each K/V head vector rounded as the CUDA cache stores it); unset
  // keeps fp32. For measuring what a format costs in accuracy.
  std::optional<KvDtype> kv_emulation;
  // The KV cache's size: it bounds what running sequences hold and what the prefix cache keeps.
  int64_t kv_cache_bytes = int64_t{1} << 30;
  // Automatic prefix caching (worker.prefix_caching).
  bool prefix_caching = false;
};

class CpuEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<CpuEngine>> Load(const std::string& dir, const CpuEngineOptions& options = {});

  std::string backend() const override { return "cpu"; }
  std::string model_id() const override { return model_id_; }
  bool simulated() const override { return false; }
  int32_t vocab_size() const override { return static_cast<int32_t>(config_.vocab_size); }
  int32_t max_context() const override { return static_cast<int32_t>(config_.max_position); }
  std::vector<int32_t> eos_token_ids() const override { return config_.eos_token_ids; }
  absl::Status Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) override;
  absl::Status Reserve(uint64_t id, int64_t max_tokens) override { return blocks_->Reserve(id, max_tokens); }
  absl::StatusOr<int32_t> AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens) override;
  void Release(uint64_t id) override { blocks_->Release(id); }
  const KvEventLog* kv_events() const override { return blocks_->events(); }
  std::optional<EngineStats> stats() const override;

  // Runs each sequence's uncomputed tokens through the model (filling its cache) and writes logits
  // [rows, vocab]: one row per new token when `all_positions`, else the last new token of each
  // sequence. Step() is this plus sampling; tests use it for teacher-forced logits.
  absl::Status Forward(std::span<const StepSequence> batch, bool all_positions, std::vector<float>* logits);

  const ModelConfig& config() const { return config_; }
  // MoE models: for each row of the last Forward, the smallest gap over layers between the last
  // chosen expert's router logit and the best unchosen one. Where it is tiny, an implementation
  // with other rounding may route differently and legitimately get other logits.
  const std::vector<float>& router_margins() const { return router_margins_; }

 private:
  struct Expert {
    std::vector<float> w1, w2, w3;  // gate [ffn, h], down [h, ffn], up [ffn, h]
  };
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, mlp_norm;
    std::vector<float> w_gate, w_up, w_down;  // dense MLP
    std::vector<float> router;                 // MoE: [experts, h]
    std::vector<Expert> experts;
  };
  static constexpr int kBlockSize = 16;
  // One row of the step: a token of some sequence at some position.
  struct Row {
    const KvBlockAllocator::Sequence* seq;
    int64_t pos;
  };
  // Where position `pos` of a sequence keeps its K (or V) in a layer's pool.
  float* KvAt(std::vector<float>& pool, const KvBlockAllocator::Sequence& s, int64_t pos) const {
    const int64_t block = s.blocks[static_cast<size_t>(pos / kBlockSize)];
    return pool.data() + (block * kBlockSize + pos % kBlockSize) * config_.kv_dim();
  }

  CpuEngine() = default;
  absl::Status LoadWeights(const Checkpoint& ckpt);
  void Attention(int64_t layer, const std::vector<Row>& rows, const float* q, float* out);
  void Mlp(const Layer& layer, int64_t rows, const float* x, float* out);

  ModelConfig config_;
  CpuEngineOptions options_;
  std::string model_id_;
  std::vector<float> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  std::vector<Layer> layers_;
  std::vector<float> rope_inv_freq_;
  std::unique_ptr<KvBlockAllocator> blocks_;
  std::vector<std::vector<float>> k_pool_, v_pool_;  // per layer: [blocks used so far, 16, kv_dim]
  std::vector<float> k_run_, v_run_;                 // one sequence's K/V gathered for attention
  std::vector<std::pair<float, int32_t>> sample_scratch_;
  std::vector<float> router_margins_;
};

}  // namespace tailserve
