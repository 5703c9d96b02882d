#pragma once
// The decode attention block for 1-16 rows in one persistent launch: q/k/v = xn · W_qkvᵀ, the
// attention of each row over its paged FP8 cache (bias, RoPE, the new position's K and V written
// into the cache, as PagedAttention with new_kv does), and x += attention · W_oᵀ.
//
// Why one launch: at batch 16 the three kernels cost the 8B step ~44 µs a layer for ~24 µs of
// bytes (docs/cuda-decode.md). cuBLASLt's q/k/v never lets a follower start early, so the
// attention's CTAs load their keys only after it, and o streams its weights only after the
// attention. Here the work splits by KV-head group g: S CTAs of group g each compute a slice of
// g's q/k/v columns (its query heads, its K and V head) over all rows; once all S have counted
// themselves done, CTA i of the group attends for row i (its first key tiles were copied at the
// kernel's start, during the GEMM); once the group's rows are done, each of its CTAs multiplies
// them by its slice of W_o's output columns over g's input columns, whose weights its producer
// warp streamed into the ring during the attention, and adds the result into x (fp32 atomics:
// the groups' sums land in any order). Per-group counters in the workspace replace the two grid
// boundaries; every CTA of the grid is resident at once (one an SM, kv_heads · S ≤ SMs), so the
// waits always end. Measured on the H200 (docs/cuda-decode.md): slower than the three
// kernels (8B, 16 rows, 512 tokens: 50-59 µs against 45), because its q/k/v phase streams W at
// ~2 TB/s, while its attention and o phases took ~19.5 µs where PagedAttention and cuBLASLt's o
// take ~29. Hence a second form: q/k/v given (AttentionBlockArgs::qkv_parts, cuBLASLt's split-K
// outputs), the launch doing the attention and o only: the engine's path at 4-16 rows
// (DecodeTuning::attention_block).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/partials.h"

namespace tailserve::cuda {

inline constexpr size_t kAttentionBlockWorkspaceBytes = 1024;

struct AttentionBlockArgs {
  const __half* xn = nullptr;       // [rows, hidden]: the normed residual (the previous kernel's)
  int rows = 0;                     // 1..AttentionBlockMaxRows
  int hidden = 0;
  int heads = 0;                    // query heads; kv heads and head_dim from the geometry
  const __half* w_qkv = nullptr;    // [(heads + 2 kv_heads) · head_dim, hidden]: q, k, v rows
  const float* bias = nullptr;      // [(heads + 2 kv_heads) · head_dim] or null
  const __half* w_o = nullptr;      // [hidden, heads · head_dim]
  const float* inv_freq = nullptr;  // [head_dim / 2]: RoPE
  float scale = 1.0f;               // 1 / sqrt(head_dim)
  int sliding_window = 0;           // 0: full causal attention
  RowMeta meta;                     // rows of distinct sequences; each row's position is not cached yet
  KvGeometry geometry;              // an FP8 cache, head_dim 32, 64 or 128
  KvLayerView layer;
  float* qkv = nullptr;             // scratch [rows, (heads + 2 kv_heads) · head_dim]
  // q/k/v computed already (xn, w_qkv and qkv unused): the k chunks' outputs of xn · W_qkvᵀ
  // (GemmRunner::RunSplitK, at most kMaxPartials), each [rows, (heads + 2 kv_heads) · head_dim].
  // The launch then does the attention and o: each CTA copies its first key tiles and streams
  // W_o into its ring from its start. None: the launch computes q/k/v itself.
  Partials qkv_parts = {};
  __half* attn = nullptr;           // scratch [rows, heads · head_dim]: the attention's output
  float* x = nullptr;               // [rows, hidden]: receives + attention · W_oᵀ
  unsigned long long* clamps = nullptr;  // the KV clamp counter
  // kAttentionBlockWorkspaceBytes, zeroed once before the first launch; every launch leaves it
  // zeroed. Launches sharing one must be ordered (one stream).
  void* workspace = nullptr;
  bool overlap_previous = false;    // launched programmatically: weights and key tiles before the wait
  // The kernel bench's timeline (null: none): CTA b (group · CTAs a group + its index) writes
  // timeline[kAttentionBlockStamps · b ..] = %globaltimer ns at its start, its q/k/v slice counted,
  // its attention's start (the group's q/k/v complete) and end (0, 0 without a row), o's start (the
  // group's rows attended), o's products done (warp 0's, before the atomic adds into x), end and
  // the RoPE done (its q in shared memory), every warp's keys computed, the heads merged and
  // written (before the count), and in slot kAttentionBlockSmSlot its SM + 1 (not a time); then
  // per warp and key tile (the first
  // kAttentionBlockStampedTiles a warp) kAttentionBlockTileEvents stamps: issue begun, issue done
  // (its block-table entry loaded, the copies out), landed (the wait for it done), computed, and
  // then not a time: the compute's SM cycles (clock64; %globaltimer ticks too coarsely for ~1 µs).
  uint64_t* timeline = nullptr;
  // Knobs the kernel bench sweeps to find what holds the q/k/v phase (docs/cuda-decode.md); the
  // defaults are the measured design. early_key_tiles: 0-2 key tiles a warp copied at
  // the kernel's start (the rest of the first two after the q/k/v phase); ring_stages: q/k/v's
  // ring stages (24 KB of W each at the 8B shape), 2-4, or with no early key tiles up to 6 at
  // head_dim 128 (5 at 64), the key buffers holding the extra ones; wide_boxes: one 48-row TMA box
  // a k box where the CTA's three W tiles are contiguous rows (else three 16-row boxes);
  // vector_adds: o's sums go into x as 4-float vector reductions (else one atomic add a float).
  // key_stages: key tiles a warp keeps in flight during the attention, 2-4 (at 512 tokens a warp
  // has 4); above 2 only with q/k/v given, the extra tiles taking the ring stages o does not use
  // (ring_stages below 4) and o's input buffer, so AttentionBlockMaxKeyStages bounds it.
  int ring_stages = 4;
  int early_key_tiles = 2;
  bool wide_boxes = false;
  bool vector_adds = true;
  int key_stages = 2;
  // late_o_stages (q/k/v given; ignored otherwise): once its attention is merged, a CTA's W_o ring
  // also takes the ring stages it did not start with and the key buffers (2 more 32 KB stages at
  // head_dim 128), so more of W_o streams during the group wait and o's staging. Off: the kernel
  // bench measured it no faster (16 rows 42.2 against 42.1 µs, 8 rows 40.1 against 39.7), its
  // attention phase ~1 µs longer.
  bool late_o_stages = false;
  // o_waits_for_keys (q/k/v given; ignored otherwise): W_o's stream starts only once every
  // consumer warp has issued its last key tile, so that a CTA asks the DRAM for its keys (and the
  // RoPE for q) before the 128 KB of W_o its ring takes, rather than beside them. Kernel bench
  // (H100): q/k/v + block 16 rows 55.3 → 52.5 µs, 8 rows 51.8 → 49.2; its first key
  // tile lands 4.4 µs after it is asked for instead of 11.
  bool o_waits_for_keys = true;
};

inline constexpr int kAttentionBlockCtaStamps = 11, kAttentionBlockSmSlot = 10;
inline constexpr int kAttentionBlockStampedWarps = 8, kAttentionBlockStampedTiles = 5, kAttentionBlockTileEvents = 5;
inline constexpr int kAttentionBlockStamps =
    kAttentionBlockCtaStamps + kAttentionBlockStampedWarps * kAttentionBlockStampedTiles * kAttentionBlockTileEvents;

// The most ring stages AttentionBlockArgs::ring_stages may ask for at this head_dim and early key
// tile count.
int AttentionBlockMaxRingStages(int head_dim, int early_key_tiles);

// The most key stages AttentionBlockArgs::key_stages may ask for with q/k/v given, at this head_dim
// and ring depth (2 without q/k/v given).
int AttentionBlockMaxKeyStages(int head_dim, int ring_stages);

// OK when AttentionBlock takes this shape on the current device; InvalidArgument says why not.
absl::Status AttentionBlockTakes(int rows, int hidden, int heads, const KvGeometry& geometry, int sliding_window);

absl::Status AttentionBlock(const AttentionBlockArgs& args, cudaStream_t stream);

}  // namespace tailserve::cuda
