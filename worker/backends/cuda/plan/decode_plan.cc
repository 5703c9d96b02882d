#include "worker/backends/cuda/plan/decode_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/kernels/partials.h"
#include "worker/backends/cuda/plan/stream_layout.h"

namespace tailserve::cuda {

absl::Status ValidateDecodeTuning(const DecodeTuning& t) {
  auto at_least = [](const char* field, int64_t value, int64_t low) {
    return value >= low ? absl::OkStatus()
                        : absl::InvalidArgumentError(absl::StrCat("cuda decode tuning: ", field, " is ", value,
                                                                  ", at least ", low, " expected"));
  };
  for (const absl::Status& s : {at_least("attention_splits", t.attention_splits, 1),
                                at_least("ffn_halves_min_bytes", t.ffn_halves_min_bytes, 0),
                                at_least("stream_min_rows", t.stream_min_rows, 2),
                                at_least("stream_qkv_chunks", t.stream_qkv_chunks, 0),
                                at_least("stream_ffn_chunks", t.stream_ffn_chunks, 0),
                                at_least("attention_block_min_rows", t.attention_block_min_rows, 1),
                                at_least("in_situ_candidates", t.in_situ_candidates, 1)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

bool TensorCoreAttention(KvDtype dtype, int head_dim) {
  return dtype != KvDtype::kFp16 && (head_dim == 32 || head_dim == 64 || head_dim == 128);
}

int AttentionRowTiles(int rows, int heads, int kv_heads, bool runs, bool tensor_cores) {
  const int group = heads / kv_heads;
  const int tile = runs && tensor_cores ? 16 / group : 1;
  return (rows + tile - 1) / tile;
}

int AttentionSplitsFor(int tiles, const PlanModel& model, const DeviceLimits& limits, int max_splits) {
  // A CTA of the attention kernel takes about kFixed + keys · kPerKey (the tensor-core kernel on
  // the H200, fitted from batch 64 at 512 and 2048 tokens with 1 and 4 splits: ~5 µs of latency
  // for q, the block table, the first tile and the merge, then ~0.035 µs a key at head_dim 128,
  // scaled by head_dim, i.e. by a key's bytes: unscaled, the 1B shape (head_dim 64, 6 CTAs an SM)
  // took 3 splits at batch 64, 1.6x slower than 1). The split count is baked into each bucket's
  // graph before contexts are known, so it minimises waves · (kFixed + keys per split · kPerKey)
  // at a design context of 1024 tokens: long CTAs amortise the latency, but a partly filled last
  // wave idles the GPU. Each split adds partials for the merge to read (batch 1 at 512 tokens:
  // 8.5 µs with 16 splits, 11.0 with 32, so ~0.14 µs a split), and more than one split needs the
  // combine kernel (~3.9 µs; one split on the tensor cores writes the output itself). At batch 1
  // the splits merge in a cluster instead (cheaper than the combine, ~1.7 µs a layer less on the
  // 8B), which the model does not price; its picks there (16 on the 8B, 11 on the 1B) still beat a
  // cap of 8 (8B 3.94 against 4.04 ms, 1B 0.85 against 0.86).
  constexpr double kFixedUs = 5.0, kPerKeyUs128 = 0.035, kPerSplitUs = 0.14, kCombineUs = 3.9;
  constexpr double kDesignContext = 1024.0;
  const double per_key_us = kPerKeyUs128 * model.head_dim / 128.0;
  const int ctas = tiles * model.kv_heads, wave = limits.attention_wave;
  int best = 1;
  double best_cost = 0.0;
  for (int splits = 1; splits <= max_splits; ++splits) {
    const double waves = static_cast<double>((ctas * splits + wave - 1) / wave);
    const double cost = waves * (kFixedUs + kDesignContext / splits * per_key_us) + kPerSplitUs * splits +
                        (splits > 1 ? kCombineUs : 0.0);
    if (splits == 1 || cost < best_cost) best = splits, best_cost = cost;
  }
  return best;
}

StepPlan PlanStep(int rows, bool decode, const PlanModel& m, const DeviceLimits& limits, const DecodeTuning& tuning,
                  int max_bucket, bool profiling) {
  StepPlan p;
  p.rows = rows;
  p.decode = decode;
  const int h = m.hidden, f = m.ffn, qd = m.q_dim();
  const bool tensor_cores = TensorCoreAttention(m.kv_dtype, m.head_dim);
  const int tiles = AttentionRowTiles(rows, m.heads, m.kv_heads, /*runs=*/!decode, tensor_cores);
  p.attention_splits = AttentionSplitsFor(tiles, m, limits, tuning.attention_splits);
  // Batch 1 of a dense model: the Gemv epilogues carry the norms, bias, residual adds, SwiGLU and
  // RoPE, 7 kernels a layer instead of 10 (gemv.h).
  p.fused_gemv = rows == 1 && m.experts == 0 && h % 8 == 0 && qd % 8 == 0 && f % 8 == 0;
  p.new_kv = decode && tensor_cores;
  p.overlap_previous = !profiling;
  // Splits merge through distributed shared memory where the grid fits one CTA an SM.
  p.cluster_merge = p.new_kv && p.attention_splits > 1 && p.attention_splits <= kMaxClusterSplits &&
                    tiles * m.kv_heads * p.attention_splits <= limits.sm_count;
  // Where 2 or 4 splits would need the combine kernel (8B batch 16: 4 splits, 512 CTAs; batch 32:
  // 2), the splits become warps of one CTA, which merges them in shared memory.
  if (p.new_kv && !p.cluster_merge && (p.attention_splits == 2 || p.attention_splits == 4)) {
    p.attention_warps = 4 * p.attention_splits, p.attention_splits = 1;
  }
  p.split_k = decode && !p.fused_gemv && rows <= max_bucket;
  p.attention_block = p.split_k && p.new_kv && tuning.attention_block && rows >= tuning.attention_block_min_rows &&
                      rows <= limits.attention_block_max_rows;
  const bool stream_rows = p.split_k && rows >= tuning.stream_min_rows && rows <= kStreamGemmMaxRows;
  // The FFN in one StreamFfn launch, its last chunks ffn · 5 / 28 features rounded down to 256 (the
  // 8B's 14336 = 6656 + 3 · 2560, the best split measured), else equal chunks, else fewer.
  if (tuning.stream_ffn_chunks > 0 && stream_rows && m.experts == 0 && h % 64 == 0) {
    const int last = f * 5 / 28 / 256 * 256;
    for (int chunks = std::min(tuning.stream_ffn_chunks, kMaxPartials); chunks >= 1 && !p.stream_ffn_chunks;
         chunks /= 2) {
      if (StreamFfnSplits(f, chunks, last, kStreamFfnLastChunks)) {
        p.stream_ffn_chunks = chunks, p.stream_ffn_last_chunk = last;
      } else if (StreamFfnSplits(f, chunks)) {
        p.stream_ffn_chunks = chunks;
      }
    }
  }
  // q/k/v by StreamGemm: k in that many chunks or fewer, at the most k boxes a stage that divide a
  // chunk (variants 4, 1, 0: 4, 2, 1 boxes).
  if (tuning.stream_qkv_chunks > 0 && stream_rows) {
    for (int chunks = std::min(tuning.stream_qkv_chunks, kMaxPartials); chunks >= 1 && !p.stream_qkv_chunks;
         chunks /= 2) {
      for (int variant : {4, 1, 0}) {
        if (h % (StreamGemmKStep(variant) * chunks) == 0) {
          p.stream_qkv_chunks = chunks, p.stream_qkv_variant = variant;
          break;
        }
      }
    }
  }
  p.ffn_halves = p.split_k && p.stream_ffn_chunks == 0 && m.experts == 0 && f % 16 == 0 && !profiling &&
                 3 * int64_t{h} * f * 2 >= tuning.ffn_halves_min_bytes;
  return p;
}

std::string StepPlan::Describe(const PlanModel& m) const {
  std::string s = absl::StrCat(decode ? "decode " : "prefill ", rows, rows == 1 ? " row" : " rows",
                               ": embed | each layer: ");
  const std::string attention =
      absl::StrCat("paged_attention (", attention_splits, attention_splits == 1 ? " split" : " splits", ", ",
                   attention_warps, " warps", cluster_merge ? ", cluster merge" : "", new_kv ? ", writes new K/V" : "",
                   ")");
  if (fused_gemv) {
    absl::StrAppend(&s, "gemv q/k/v", new_kv ? " (+norm, rope) > " : " (+norm) > rope_kv_write > ", attention,
                    " > gemv o > gemv gate/up (+norm, swiglu) > gemv down");
  } else {
    absl::StrAppend(&s, "rmsnorm", norm_triggers_qkv_early() ? " (early trigger)" : "");
    if (stream_qkv_chunks > 0) {
      absl::StrAppend(&s, " > stream_gemm q/k/v (", stream_qkv_chunks, " k chunks, variant ", stream_qkv_variant, ")");
    } else {
      absl::StrAppend(&s, " > cublaslt q/k/v", split_k ? " (split-k 2)" : "");
    }
    if (attention_block) {
      absl::StrAppend(&s, " > attention_block (attention + o, writes new K/V)");
    } else {
      absl::StrAppend(&s, new_kv ? "" : " > rope_kv_write", " > ", attention, " > cublaslt o",
                      split_k ? " (split-k 2)" : "");
    }
    absl::StrAppend(&s, " > rmsnorm", norm_triggers_ffn_early() ? " (early trigger)" : "");
    if (stream_ffn_chunks > 0) {
      absl::StrAppend(&s, " > stream_ffn (", stream_ffn_chunks, " down chunks",
                      stream_ffn_last_chunk > 0 ? absl::StrCat(", the last ", kStreamFfnLastChunks, " of ",
                                                               stream_ffn_last_chunk, " features")
                                                : "",
                      ")");
    } else if (m.experts > 0) {
      absl::StrAppend(&s, " > moe (router, then each of ", m.experts,
                      " experts: cublaslt gate/up > swiglu > cublaslt down > combine)");
    } else if (ffn_halves) {
      absl::StrAppend(&s, " > ffn halves on two graph branches (cublaslt gate/up > swiglu > cublaslt down, split-k 2)");
    } else {
      absl::StrAppend(&s, " > cublaslt gate/up > swiglu > cublaslt down", split_k ? " (split-k 2)" : "");
    }
  }
  if (decode) {
    absl::StrAppend(&s, fused_gemv ? " | gemv lm_head (+norm)" : " | rmsnorm > cublaslt lm_head", " > sample");
  }
  if (overlap_previous) absl::StrAppend(&s, "; programmatic launches");
  return s;
}

}  // namespace tailserve::cuda
