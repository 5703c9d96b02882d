#pragma once
// Which kernels a forward of `rows` token rows runs, decided once per decode bucket at load (and
// per prefill chunk) from the model's shape, the device's limits and the tuning below: FlashInfer's
// plan/run split. The forward pass (forward.cc) only launches what the plan says; the plan is
// plain C++, so every path decision is unit-tested on the CPU and logged at load, one line a
// bucket (Describe). docs/cuda-decode.md says why each range takes its path.
#include <cstdint>
#include <string>

#include "absl/status/status.h"

#include "worker/engine/kv_dtype.h"

namespace tailserve::cuda {

// The decode path's tuning. Its defaults are the one path the worker runs; the benchmarks and
// tests set the fields to measure or cover the alternatives still kept.
struct DecodeTuning {
  // The most key splits the attention may take (SplitsFor picks from 1 to this).
  int attention_splits = 32;
  // Above batch 1 on cuBLASLt, a dense FFN runs as two halves on two graph branches when its
  // three matrices hold at least this many bytes (0: always; tests cover the halves that way).
  // Smaller FFNs lose: each half's GEMMs are too short to hide the other's edges.
  int64_t ffn_halves_min_bytes = int64_t{200} << 20;
  // From stream_min_rows to kStreamGemmMaxRows rows: q/k/v by StreamGemm in this many k chunks
  // and the whole FFN by one StreamFfn launch in this many down chunks (0: cuBLASLt's instead).
  int stream_min_rows = 3;
  int stream_qkv_chunks = 4;
  int stream_ffn_chunks = 4;
  // From this many rows (to what the device allows): the attention and o in one AttentionBlock
  // launch on an FP8 cache (false: PagedAttention, then o on its own).
  bool attention_block = true;
  int attention_block_min_rows = 4;
  // At load, each cuBLASLt shape's best candidates timed inside the captured step (1: the pick
  // timed alone).
  int in_situ_candidates = 6;
};

// INVALID_ARGUMENT naming the field when a tuning value is out of its range.
absl::Status ValidateDecodeTuning(const DecodeTuning& tuning);

// The model as the plan sees it.
struct PlanModel {
  int hidden = 0;
  int ffn = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int experts = 0;  // > 0: MoE
  int sliding_window = 0;
  KvDtype kv_dtype = KvDtype::kFp8E4M3;
  int q_dim() const { return heads * head_dim; }
};

// What the device and the kernels allow, queried once at load.
struct DeviceLimits {
  int sm_count = 132;
  int attention_wave = 396;  // decode attention CTAs resident at once
  // The most rows AttentionBlock takes for this model's shape (0: none).
  int attention_block_max_rows = 0;
};

// Lengths the forward pass has fixed, not tuned.
inline constexpr int kDecodeKSplits = 2;        // cuBLASLt split-K chunks of q/k/v, o and down above batch 1
inline constexpr int kMaxClusterSplits = 16;    // the largest (non-portable) cluster on sm_90
inline constexpr int kStreamFfnLag = 3;         // StreamFfnArgs::lag
inline constexpr int kStreamFfnLastChunks = 3;  // StreamFfnArgs::last_chunks

// The tensor-core attention (FP8 cache, head_dim 32 / 64 / 128), which at decode writes the new
// token's K/V itself.
bool TensorCoreAttention(KvDtype dtype, int head_dim);
// Row tiles of the attention grid: prefill runs share a CTA (16 / group rows) on the tensor cores.
int AttentionRowTiles(int rows, int heads, int kv_heads, bool runs, bool tensor_cores);

struct StepPlan {
  int rows = 0;
  bool decode = false;
  // Batch 1, dense: every norm, bias, residual add, SwiGLU and RoPE in the Gemv epilogues.
  bool fused_gemv = false;
  // Decode on the tensor cores: the attention writes the new K/V (no RoPE kernel).
  bool new_kv = false;
  // Kernels launch programmatically after their predecessor (off while profiling: an event sits
  // between every two ops).
  bool overlap_previous = false;
  int attention_splits = 1;
  int attention_warps = 4;
  bool cluster_merge = false;
  // Decode above batch 1: the projections write k-chunk partials the next consumer adds.
  bool split_k = false;
  bool attention_block = false;
  int stream_qkv_chunks = 0;  // > 0: q/k/v by StreamGemm
  int stream_qkv_variant = 0;
  int stream_ffn_chunks = 0;  // > 0: the FFN by StreamFfn
  int stream_ffn_last_chunk = 0;
  bool ffn_halves = false;
  // The RMSNorms that let their StreamGemm / StreamFfn follower start before their own wait.
  bool norm_triggers_qkv_early() const { return stream_qkv_chunks > 0; }
  bool norm_triggers_ffn_early() const { return stream_ffn_chunks > 0; }

  // One line: the kernels of a layer in order, then the attention's grid.
  std::string Describe(const PlanModel& model) const;
};

// `decode`: one row per sequence, sampled (else prefill rows, runs of consecutive positions).
// `max_bucket`: the largest decode graph's rows (split-K workspaces are sized for it).
// `profiling`: ProfileDecode's capture, an event after every op.
StepPlan PlanStep(int rows, bool decode, const PlanModel& model, const DeviceLimits& limits,
                  const DecodeTuning& tuning, int max_bucket, bool profiling = false);

// Attention key splits for `tiles` row tiles: enough CTAs to fill the GPU, no more (a cost model
// fitted on the H200; decode_plan.cc gives its numbers).
int AttentionSplitsFor(int tiles, const PlanModel& model, const DeviceLimits& limits, int max_splits);

}  // namespace tailserve::cuda
