#pragma once
// Attention over the paged KV cache, for decode and prefill rows alike: each row (a token at
// position p of some sequence) attends to its sequence's cached positions [p - window + 1, p].
// GQA-aware: one CTA serves all query heads of a KV head, so each K/V element is read once per
// row and group. The key range is split across `splits` CTAs (long contexts fill the GPU even at
// batch 1) and the partial softmaxes are merged by a second kernel (with one split, or the splits
// merged in a thread-block cluster, the tensor-core kernel writes the output itself). Prefill rows (`runs`) are
// tiled: the tokens of a tile share every K/V load, each with its causal mask. FP8 caches with
// head_dim 32/64/128 run on the tensor cores (attention_mma.cuh); fp16 caches and other head
// sizes on a CUDA-core kernel with the same split layout (one row per CTA).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/partials.h"
#include "worker/backends/cuda/plan/decode_plan.h"  // kMaxClusterSplits, TensorCoreAttention

namespace tailserve::cuda {

// Decode with new_kv above batch 1: the attention CTA applies the bias and RoPE to its row's q
// heads and new K itself (the sum of a split-K projection's partials, then as RopeWriteKv
// computes them), so no RoPE kernel sits between q/k/v and the attention.
struct AttentionRope {
  const float* inv_freq = nullptr;  // [head_dim / 2]; null: q, K and V arrive rotated (the batch-1 Gemv)
  Partials parts = {};              // the projection's chunk outputs, q's layout; none: q holds the projection
  const float* bias = nullptr;      // [heads + 2 kv_heads] * head_dim, or null
};

struct AttentionShape {
  int rows = 0;
  int heads = 0;
  int q_stride = 0;        // floats between rows of q (the fused qkv row width)
  int sliding_window = 0;  // 0: full causal attention
  int splits = 1;          // CTAs per (row tile, KV head); partials: rows * heads * splits * (head_dim + 2) floats
  float scale = 1.0f;      // 1 / sqrt(head_dim)
  // Prefill: rows come in runs of consecutive positions of one sequence, so the tensor-core kernel
  // gives a CTA 16 / G rows that share each K/V tile (correct for any layout, fast for runs).
  bool runs = false;
  // Decode only (AttentionTakesNewKv), rows of distinct sequences: each row's own position is not
  // in the cache yet. Its K and V follow the row's q heads (k heads, then v heads, fp32: rotated
  // as the batch-1 q/k/v Gemv with RoPE leaves them, or as `rope` computes them), and the CTA whose
  // split holds that position encodes them into the cache as RopeWriteKv would, counting clamps in
  // PagedAttention's `clamps`.
  bool new_kv = false;
  // Launch the tensor-core kernel with programmatic stream serialization: its prologue and, when
  // decoding, its first tile of previously cached keys (with new_kv, also the tile holding the new
  // position, whose rows the writer overwrites) overlap the kernel before it (RoPE, the q/k/v
  // GEMM or the batch-1 q/k/v Gemv). The previous kernel must not read
  // `out` or the workspace (a CTA with no keys writes them before it waits). The split combine
  // (more than one split) follows it the same way and lets its own follower start at once; with
  // cluster_merge the attention's own CTAs let it start (an empty split triggers at once, the
  // others after their wait). Either way the batch-1 o Gemv loads weights while the attention
  // runs. Needs a non-default stream.
  bool overlap_previous = false;
  // Decode on the tensor cores with 2..kMaxClusterSplits splits: a row's splits run as one
  // thread-block cluster and merge through distributed shared memory, writing `out` themselves (no
  // partials, no combine kernel). Measured on the H200 (8B shape, 512 tokens): batch 1 (128 CTAs)
  // −1.7 µs a layer, but batch 16 (512 CTAs, 4 an SM) +8 µs, so the engine asks for it only when
  // the grid fits one CTA an SM.
  bool cluster_merge = false;
  // Decode on the tensor cores: warps a CTA, 4, 8 or 16. A CTA's warps split its keys and merge in
  // shared memory, so 4·s warps and one split stream like 4 warps and s splits, without the
  // partials and the combine kernel (which cluster_merge avoids only where the grid fits one CTA
  // an SM). Prefill takes 4.
  int warps = 4;
  AttentionRope rope = {};  // with new_kv only
};

// Whether PagedAttention takes new_kv for this cache (the tensor-core kernel: FP8, head_dim 32/64/128).
bool AttentionTakesNewKv(const KvGeometry& geometry);

// Row tiles (CTAs per KV head and split) PagedAttention launches for this shape.
int AttentionRowTiles(const AttentionShape& shape, const KvGeometry& geometry);

// CTAs of the kernel PagedAttention runs for this shape that fit one SM at once.
absl::StatusOr<int> AttentionCtasPerSm(const AttentionShape& shape, const KvGeometry& geometry);

// Floats of workspace the partial results need.
size_t AttentionWorkspaceFloats(const AttentionShape& shape, int head_dim);

// q: fp32 rows (q heads first in each row, as RopeWriteKv leaves them, or the projection with rope);
// out: fp16 [rows, heads * head_dim].
// clamps: the clamp counter, needed with shape.new_kv only.
absl::Status PagedAttention(const float* q, const AttentionShape& shape, const RowMeta& meta, const KvGeometry& geometry,
                            const KvLayerView& layer, float* workspace, __half* out, cudaStream_t stream,
                            unsigned long long* clamps = nullptr);

}  // namespace tailserve::cuda
