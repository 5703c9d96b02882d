#pragma once
// The decode attention block for 1-16 rows in one persistent launch, after the q/k/v projection:
// the attention of each row over its paged FP8 cache (the projection's split-K partials summed,
// bias, RoPE, the new position's K and V written into the cache, as PagedAttention with new_kv
// does), then x += attention · W_oᵀ.
//
// Why one launch: at batch 16 PagedAttention and cuBLASLt's o cost the 8B step ~29 µs a layer for
// far fewer bytes' worth (docs/cuda-decode.md): o streams its weights only after the attention.
// Here the work splits by KV-head group g: S CTAs a group (one an SM, kv_heads · S ≤ SMs, so every
// CTA is resident and every wait ends). CTA i of group g attends for row i (its first key tiles
// copied at its start, before the previous kernel is done); its producer warp streams the CTA's
// slice of W_o (its output columns over g's input columns) into a ring once the key tiles are
// asked for; once the group's rows are attended, each CTA multiplies them by its slice and adds
// the result into x (fp32 vector reductions: the groups' sums land in any order). Per-group
// counters in the workspace replace the grid boundary between the attention and o. The form that
// also computed q/k/v in the launch lost to cuBLASLt's or StreamGemm's q/k/v before it (its q/k/v
// phase streamed W at ~2 TB/s) and was removed. The engine's path at 4-16 rows
// (DecodeTuning::attention_block). Pieces: attention_block_attend.cuh (a row's attention),
// attention_block_o.cuh (the o projection); the kernel and launcher in attention_block.cu.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/partials.h"

namespace tailserve::cuda {

inline constexpr size_t kAttentionBlockWorkspaceBytes = 1024;

struct AttentionBlockArgs {
  int rows = 0;                     // 1..16 (and at most the CTAs of a group)
  int hidden = 0;
  int heads = 0;                    // query heads; kv heads and head_dim from the geometry
  const float* bias = nullptr;      // [(heads + 2 kv_heads) · head_dim] or null
  const __half* w_o = nullptr;      // [hidden, heads · head_dim]
  const float* inv_freq = nullptr;  // [head_dim / 2]: RoPE
  float scale = 1.0f;               // 1 / sqrt(head_dim)
  int sliding_window = 0;           // 0: full causal attention
  RowMeta meta;                     // rows of distinct sequences; each row's position is not cached yet
  KvGeometry geometry;              // an FP8 cache, head_dim 32, 64 or 128
  KvLayerView layer;
  // The q/k/v projection: the k chunks' outputs of xn · W_qkvᵀ (GemmRunner::RunSplitK or
  // StreamGemm, 1..kMaxPartials), each [rows, (heads + 2 kv_heads) · head_dim].
  Partials qkv_parts = {};
  __half* attn = nullptr;           // scratch [rows, heads · head_dim]: the attention's output
  float* x = nullptr;               // [rows, hidden]: receives + attention · W_oᵀ
  unsigned long long* clamps = nullptr;  // the KV clamp counter
  // kAttentionBlockWorkspaceBytes, zeroed once before the first launch; every launch leaves it
  // zeroed. Launches sharing one must be ordered (one stream).
  void* workspace = nullptr;
  bool overlap_previous = false;    // launched programmatically: key tiles and W_o before the wait
  // The kernel bench's timeline (null: none): CTA b (group · CTAs a group + its index) writes
  // timeline[kAttentionBlockStamps · b ..] = %globaltimer ns at its start, (slot 1 unused), its
  // attention's start and end (0, 0 without a row), o's start (the group's rows attended), o's
  // products done (warp 0's, before the adds into x), end, the RoPE done (its q in shared memory),
  // every warp's keys computed, the heads merged and written (before the count), and in slot
  // kAttentionBlockSmSlot its SM + 1 (not a time); then per warp and key tile (the first
  // kAttentionBlockStampedTiles a warp) kAttentionBlockTileEvents stamps: issue begun, issue done
  // (its block-table entry loaded, the copies out), landed (the wait for it done), computed, and
  // then not a time: the compute's SM cycles (clock64; %globaltimer ticks too coarsely for ~1 µs).
  uint64_t* timeline = nullptr;
};

inline constexpr int kAttentionBlockCtaStamps = 11, kAttentionBlockSmSlot = 10;
inline constexpr int kAttentionBlockStampedWarps = 8, kAttentionBlockStampedTiles = 5, kAttentionBlockTileEvents = 5;
inline constexpr int kAttentionBlockStamps =
    kAttentionBlockCtaStamps + kAttentionBlockStampedWarps * kAttentionBlockStampedTiles * kAttentionBlockTileEvents;

// OK when AttentionBlock takes this shape on the current device; InvalidArgument says why not.
absl::Status AttentionBlockTakes(int rows, int hidden, int heads, const KvGeometry& geometry, int sliding_window);

absl::Status AttentionBlock(const AttentionBlockArgs& args, cudaStream_t stream);

}  // namespace tailserve::cuda
