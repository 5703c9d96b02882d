#pragma once
// Decode/prefill attention over an FP8 paged cache on the tensor cores (mma.sync m16n8k16, fp16
// inputs, fp32 accumulation): the kernel, included by attention.cu. Its pieces (tiles and the online
// softmax, the merges, the new position's K/V) are attention_mma_*.cuh, which the attention block shares.
//
// Why: the CUDA-core kernel spent ~180 warp-instructions per cached key (decode, 8B shape, batch
// 64: ncu found it issue-bound at 15% of DRAM bandwidth). Here a warp takes 16 keys at a time:
//   S[16 query rows × 16 keys] = Q · Kᵀ   (head_dim / 16 × 2 mma; decoding, the group's G ≤ 8
//                                          query heads fill rows 0..G-1 and the rest are zero;
//                                          in prefill 16 / G tokens × G heads fill all 16)
//   online softmax on S's fragments (exp2 domain, each row's max/sum across a lane quad)
//   O[16 × head_dim] += P · V              (head_dim / 8 mma, P reused from S's registers;
//                                          decoding, Oᵀ[head_dim × 8 heads] += Vᵀ · Pᵀ instead:
//                                          head_dim / 16 mma, no empty rows)
// about 20 warp-instructions per key. FP8 → fp16 is exact, so only q (fp16) and P (fp16) round.
// Each warp streams its own tiles (keys begin + 16·(warp + W·i), W warps a CTA) through a
// two-stage cp.async buffer in shared memory, with no block-wide barrier until the warps merge
// their partial softmaxes at the end. The V scale of each key folds into P relative to the
// tile's largest V scale (so P stays in fp16's normal range), and O carries that factor from
// tile to tile.
#include "worker/backends/cuda/kernels/attention_mma_merge.cuh"
#include "worker/backends/cuda/kernels/attention_mma_new_kv.cuh"
#include "worker/backends/cuda/kernels/attention_mma_tiles.cuh"

namespace tailserve::cuda {
namespace mma_attention {

// Dynamic shared memory a CTA of `warps` takes: the 4-warp kernel keeps its two stages a warp in
// static shared memory (37 KB at head_dim 128); 16 warps need 147 KB, past the 48 KB static limit,
// and their CTA keeps the rotated q heads (8 · hd floats) after the stages, so that both of a
// warp's stages can be filled before the wait.
constexpr int DynamicSmemBytes(int hd, int warps) {
  return warps == kDefaultWarps ? 0 : StageBytes(hd, warps) + 8 * hd * static_cast<int>(sizeof(float));
}

// The CTA's stage buffers, [warp][2], in dynamic shared memory (W > kDefaultWarps).
template <int HD, int W>
__device__ __forceinline__ Stage<HD> (*DynamicStages())[2] {
  static_assert(W == kDefaultWarps || StageBytes(HD, W) == sizeof(Stage<HD>) * W * 2, "stage size");
  extern __shared__ __align__(16) uint8_t dynamic_smem[];
  return reinterpret_cast<Stage<HD>(*)[2]>(dynamic_smem);
}

// Grid (tiles, kv_heads, splits), kWarps · 32 threads and DynamicSmemBytes(HD, kWarps) of
// dynamic shared memory. Writes each split's partial (acc[hd], max, sum per row and query head,
// natural-log max) in the layout the combine kernel reads, or with one split (or cluster_merge)
// the normalised output itself.
// Decode (kTiled false): a tile is one row; its G ≤ 8 query heads fill mma rows 0..G-1 and rows
// 8..15 are zero. Prefill (kTiled true): a tile is rows [x·T, x·T + T) with T = 16 / G, taken as
// runs of consecutive positions of one sequence (a single run unless a sequence starts inside the
// tile): a run's tokens share every K/V tile, mma row r = token r / G, head r % G, each row with its
// own causal (and sliding-window) mask. Any row layout is correct; runs only make it fast.
// new_kv (decode only): each row's own position is not cached yet; its K and V (rotated, fp32) sit
// in the row after the q heads, as the batch-1 q/k/v Gemv leaves them, and the CTA whose split
// holds that position encodes them into the cache (clamps counted) and into its tile.
// cluster_merge (decode only, launched with clusters of `splits` CTAs along z): the splits merge
// through distributed shared memory and write the output, no partials and no combine kernel (the
// combine cost ~3 µs a layer at batch 1: a kernel boundary plus two L2 round trips).
template <KvDtype D, int HD, bool kTiled, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, MinBlocks(HD, kTiled, kWarps))
    AttentionMmaKernel(const float* q, int rows, int heads, int q_stride, int sliding_window, int splits, float scale,
                       RowMeta meta, KvGeometry g, KvLayerView layer, float* partial, __half* out, bool new_kv,
                       unsigned long long* clamps, bool cluster_merge, AttentionRope rope) {
  static_assert(HD == 32 || HD == 64 || HD == 128, "head_dim 32, 64 or 128 (the decode Vᵀ loads take HD / 8 bytes)");
  constexpr int kChunks = HD / 16;  // k-steps of Q·Kᵀ
  constexpr int kDimTiles = HD / 8;  // n-tiles of P·V (prefill)
  // Decode computes Oᵀ = Vᵀ · Pᵀ instead (see below): HD / 16 m-tiles, and each lane multiplies
  // HD / 8 contiguous bytes of a V row.
  constexpr int kOTiles = kTiled ? kDimTiles : HD / 16;
  constexpr int kHalves = kTiled ? 2 : 1;  // mma row halves in use: rows qg (and qg + 8)
  __shared__ Stage<HD> static_stages[kWarps == kDefaultWarps ? kWarps : 1][2];
  Stage<HD>(*const stages)[2] = kWarps == kDefaultWarps ? static_stages : DynamicStages<HD, kWarps>();
  __shared__ alignas(16) float fresh_s[2][kTiled ? 4 : HD];  // new_kv: the row's own K, V

  const int kv_head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qg = lane >> 2, qc = lane & 3;  // fragment row group and column pair
  const int group = heads / g.kv_heads, kvh = g.kv_heads;
  const int tile_rows = kTiled ? 16 / group : 1;
  const int tile_end = min(rows, (static_cast<int>(blockIdx.x) + 1) * tile_rows);
  // Merge buffers: [kWarps][16][HD], decode [kWarps][8] rows at DecodeMergeAt.
  static_assert(kDecodeMergeRows * DecodeMergeStride<HD>() <= 16 * HD, "the decode layout fits the merge buffer");
  float* o_s = reinterpret_cast<float*>(&stages[0][0]);
  float* ml_s = o_s + kWarps * 16 * HD;                  // [kWarps][16][2]
  float* merged_ml_s = ml_s + kWarps * 32;                // [16][2]: the CTA's max (log2) and sum (cluster_merge)
  static_assert(sizeof(Stage<HD>) * kWarps * 2 >= (kWarps * 16 * HD + kWarps * 32 + 32) * sizeof(float), "merge buffer");

  for (int r0 = blockIdx.x * tile_rows, run_end; r0 < tile_end; r0 = run_end) {
    const int pos0 = meta.pos[r0];
    run_end = r0 + 1;
    while (run_end < tile_end && meta.seq[run_end] == meta.seq[r0] && meta.pos[run_end] == pos0 + (run_end - r0)) {
      ++run_end;
    }
    const int run = run_end - r0;
    // Keys [lo, hi] cover every token of the run. This lane's mma row r = qg + 8h is token r / G
    // of the run (query head kv_head·G + r % G) and sees keys [row_lo[h], row_pos[h]].
    const int lo = sliding_window > 0 ? max(0, pos0 - sliding_window + 1) : 0;
    const int hi = pos0 + run - 1;
    const int n = hi + 1 - lo;
    const int chunk = ((n + splits - 1) / splits + 31) & ~31;
    const int begin = lo + split * chunk, end = min(hi + 1, begin + chunk);
    const int mma_rows = run * group;
    // Partial of mma row r (token r / G, head r % G).
    auto out_at = [&](int r) {
      const int64_t row_head = static_cast<int64_t>(r0 + r / group) * heads + kv_head * group + r % group;
      return partial + (row_head * splits + split) * (HD + 2);
    };
    // One split or cluster_merge: the merge below writes the output itself (no combine launch).
    auto final_at = [&](int r) {
      return out + (static_cast<int64_t>(r0 + r / group) * heads + kv_head * group + r % group) * HD;
    };
    if (begin >= end) {  // writes before GridDependencyWait: the previous kernel must not read out / partial
      if constexpr (!kTiled) {
        // No keys: the others skip this CTA's max; it still merges its share of `out`, which it
        // writes without waiting. That is safe because split 0 always has keys (a chunk is at
        // least 32 keys and a row at least one) and reaches the cluster barrier only after its
        // GridDependencyWait, so the previous kernel has finished by then.
        if (cluster_merge) {
          TriggerDependents();  // it never waits, and the follower must not wait for its exit
          if (threadIdx.x < mma_rows) merged_ml_s[2 * threadIdx.x] = -INFINITY;
          ClusterMerge<HD>(o_s, merged_ml_s, mma_rows, splits, [&](int r) { return final_at(r); });
          continue;
        }
      }
      if (splits == 1) {
        for (int i = threadIdx.x; i < mma_rows * HD; i += blockDim.x) final_at(i / HD)[i % HD] = __float2half(0.0f);
        continue;
      }
      for (int i = threadIdx.x; i < mma_rows * HD; i += blockDim.x) out_at(i / HD)[i % HD] = 0.0f;
      if (threadIdx.x < mma_rows) out_at(threadIdx.x)[HD] = -INFINITY, out_at(threadIdx.x)[HD + 1] = 0.0f;
      continue;
    }
    bool row_ok[kHalves];
    int row_pos[kHalves], row_lo[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int r = qg + 8 * h;
      row_ok[h] = r < mma_rows;
      row_pos[h] = pos0 + r / group;
      row_lo[h] = sliding_window > 0 ? max(0, row_pos[h] - sliding_window + 1) : 0;
    }

    const int32_t* blocks = BlockTableRow(meta, g, r0);
    // Starts copying tile `t0` into stage `s` and loads this lane's scale (IssueTile).
    auto issue = [&](int t0, int s, float* scale_out) {
      IssueTile<HD>(stages[warp][s], blocks, g, layer, kv_head, t0, end, scale_out);
    };

    float o[kOTiles][4];
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    SoftmaxState sm_state;  // rows qg (+ 8)

    int t0 = begin + warp * kKeys;
    float scale_cur = 0.0f, scale_next = 0.0f;
    // Launched programmatically, this prologue and (decoding) a first tile of keys cached in
    // earlier steps overlap the previous kernel; q, the new position's K/V and (new_kv) its stash
    // are that kernel's, so they wait. With new_kv nothing writes the cache before this kernel, so
    // the tile holding the new position goes early too (the writer overwrites that key's rows and
    // scales in the stage before use). Prefill tiles hold this step's keys: they wait.
    const bool early = !kTiled && t0 < end && (new_kv || t0 + kKeys <= pos0);
    if (early) issue(t0, 0, &scale_cur);
    // Wider CTAs keep q apart from the stages, so the warp's second tile goes early too: at 512
    // keys and 16 warps that is all of a CTA's keys in flight from its start, where it used to
    // wait for q's loads and the RoPE below.
    constexpr bool kQApart = kWarps != kDefaultWarps;
    const int t1 = t0 + kWarps * kKeys;
    const bool early1 = kQApart && early && t1 < end && (new_kv || t1 + kKeys <= pos0);
    if (early1) issue(t1, 1, &scale_next);
    GridDependencyWait();
    TriggerDependents();  // the batch-1 o Gemv after it may launch (common.cuh)
    // new_kv: the warp whose tile holds pos0 copies its K and V after the wait (they are the
    // previous kernel's) and, at that tile, encodes them (see below).
    const bool writer = !kTiled && new_kv && begin <= pos0 && pos0 < end && warp == (pos0 - begin) / kKeys % kWarps;
    const bool rope_here = !kTiled && rope.inv_freq != nullptr;
    const bool fresh_group = writer && !rope_here;
    if (fresh_group) {
      const float* fresh = q + static_cast<int64_t>(r0) * q_stride + (heads + kv_head) * HD;
      for (int piece = lane; piece < HD / 2; piece += 32) {  // 16-byte pieces: HD / 4 of K, then of V
        const int which = piece / (HD / 4), at = piece % (HD / 4) * 4;
        __pipeline_memcpy_async(&fresh_s[which][at], fresh + which * kvh * HD + at, 16);
      }
      __pipeline_commit();  // a group of its own: the loop's first wait covers it, early tile or not
    }
    if (!early && t0 < end) issue(t0, 0, &scale_cur);  // before q, so its DRAM latency overlaps q's loads
    // rope_here: the row's q heads, rotated, after the stages (kQApart) or in warp 0's second stage
    // until every warp has its fragments (the loop's first copy into that stage comes after the
    // barrier below); a static array would cost the batch-1 kernel the shared memory its o Gemv
    // neighbours preload into.
    static_assert(sizeof(Stage<HD>) >= 8 * HD * sizeof(float), "G <= 8 q heads fit a stage");
    float* q_s = kQApart ? reinterpret_cast<float*>(&stages[kWarps][0]) : reinterpret_cast<float*>(&stages[0][1]);
    if (rope_here) {  // CTA-uniform
      RopeIntoShared<HD>(q + static_cast<int64_t>(r0) * q_stride, rope, static_cast<int64_t>(r0) * q_stride,
                         static_cast<float>(pos0), heads, kvh, group, kv_head, q_s, &fresh_s[0][0], blockDim.x);
      __syncthreads();
    }

    // Q fragments (scaled into the exp2 domain); rows past the run are zero. a0/a2: row qg, dims
    // 2qc.. and 2qc + 8..; a1/a3: the same for row qg + 8 (always zero when decoding).
    uint32_t qa[kChunks][2 * kHalves];
    {
      const float qs = scale * kLog2e;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const int r = qg + 8 * h;
        const float* qrow = rope_here ? q_s + (r % group) * HD
                                      : q + static_cast<int64_t>(r0 + r / group) * q_stride +
                                            (kv_head * group + r % group) * HD;
#pragma unroll
        for (int kc = 0; kc < kChunks; ++kc) {
          if (row_ok[h]) {
            const float* p = qrow + kc * 16 + 2 * qc;
            qa[kc][h] = PackHalf2(p[0] * qs, p[1] * qs);
            qa[kc][kHalves + h] = PackHalf2(p[8] * qs, p[9] * qs);
          } else {
            qa[kc][h] = qa[kc][kHalves + h] = 0u;
          }
        }
      }
    }
    if (rope_here && !kQApart) __syncthreads();  // q_s is warp 0's stage 1 again

    for (int it = 0; t0 < end; ++it, t0 += kWarps * kKeys) {
      const int s = it & 1, t_next = t0 + kWarps * kKeys;
      if (it == 0 && early1) {
        // t_next is in flight already; the fresh K/V, committed after it, must have landed.
        if (fresh_group) {
          __pipeline_wait_prior(0);
        } else {
          __pipeline_wait_prior(1);
        }
      } else {
        if (t_next < end) {
          issue(t_next, s ^ 1, &scale_next);
        } else {
          __pipeline_commit();  // an empty group keeps the wait count uniform
        }
        __pipeline_wait_prior(1);
      }
      __syncwarp();
      if constexpr (!kTiled) {
        if (writer && t0 <= pos0 && pos0 < t0 + kKeys) {
          WriteNewKv<D, HD>(fresh_s, stages[warp][s], pos0 - t0, CacheSlot(blocks, g.block_size, pos0), kv_head, g,
                            layer, &scale_cur, clamps);
        }
      }
      const uint8_t* ks = stages[warp][s].k;
      const uint8_t* vs = stages[warp][s].v;

      float sc[2][4];
      QkScores<D, HD, kHalves>(ks, qa, sc);
      float p[kHalves][2][2];
      const TileScales ts = ScaleScores<kHalves>(
          sc, scale_cur,
          [&](int h, int at) {
            return at < end && (!kTiled || (row_ok[h] && at <= row_pos[h] && at >= row_lo[h]));
          },
          t0, p);
      uint32_t pa[4] = {0u, 0u, 0u, 0u};
      float f[kHalves];
      SoftmaxStep<kHalves>(p, ts, &sm_state, pa, f);
      if constexpr (kTiled) {
        PrefillPv<D, HD>(vs, pa, f, o);
      } else {
        DecodePv<D, HD>(vs, pa, f[0], o);
      }
      scale_cur = scale_next;
      __syncwarp();  // this stage is refilled by the next iteration's issue
    }
    __pipeline_wait_prior(0);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      sm_state.l[h] += __shfl_xor_sync(0xffffffffu, sm_state.l[h], 1);
      sm_state.l[h] += __shfl_xor_sync(0xffffffffu, sm_state.l[h], 2);
    }

    // Merge the warps' partial softmaxes through the stage buffers.
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int r = qg + 8 * h;
      if constexpr (kTiled) {
#pragma unroll
        for (int t = 0; t < kDimTiles; ++t) {
          o_s[(warp * 16 + r) * HD + 8 * t + 2 * qc] = o[t][2 * h] * sm_state.o_scale;
          o_s[(warp * 16 + r) * HD + 8 * t + 2 * qc + 1] = o[t][2 * h + 1] * sm_state.o_scale;
        }
      }
      if (qc == 0) ml_s[(warp * 16 + r) * 2] = sm_state.m[h], ml_s[(warp * 16 + r) * 2 + 1] = sm_state.l[h];
    }
    if constexpr (!kTiled) StoreDecodeO<HD>(o_s, warp, o, sm_state.o_scale);
    __syncthreads();
    for (int i = threadIdx.x; i < mma_rows * HD; i += blockDim.x) {
      const int r = i / HD, d = i % HD;
      // This thread's element of warp w's slot (read by this thread alone).
      auto slot = [&](int w) {
        return kTiled ? (w * 16 + r) * HD + d : DecodeMergeAt<HD>(w * kDecodeMergeRows + r, d);
      };
      const auto [mm, acc, sum] = MergeWarps<kWarps>(o_s, ml_s, r, slot);
      if (splits == 1) {
        final_at(r)[d] = __float2half(acc / sum);
        continue;
      }
      if (cluster_merge) {  // in place, in warp 0's slot: ClusterMerge reads the decode layout
        o_s[slot(0)] = acc;
        if (d == 0) merged_ml_s[2 * r] = mm, merged_ml_s[2 * r + 1] = sum;
        continue;
      }
      out_at(r)[d] = acc;
      if (d == 0) out_at(r)[HD] = mm / kLog2e, out_at(r)[HD + 1] = sum;
    }
    if constexpr (!kTiled) {
      if (cluster_merge) ClusterMerge<HD>(o_s, merged_ml_s, mma_rows, splits, [&](int r) { return final_at(r); });
    }
    __syncthreads();  // the next run refills the stage buffers
  }
}

}  // namespace mma_attention
}  // namespace tailserve::cuda
