#pragma once
// Decode/prefill attention over an FP8 paged cache on the tensor cores (mma.sync m16n8k16, fp16
// inputs, fp32 accumulation). Included by attention.cu, and by attention_block.cu for its helpers.
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
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline_primitives.h>
#include <cooperative_groups.h>

#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/kv_codec.cuh"
#include "worker/backends/cuda/kernels/tma.cuh"

namespace tailserve::cuda {
namespace mma_attention {

constexpr int kDefaultWarps = 4;  // warps a CTA; decode also takes 8 and 16 (AttentionShape::warps)
constexpr int kKeys = 16;  // keys per warp tile
constexpr float kLog2e = 1.4426950408889634f;

// Bytes between cached keys in a stage buffer: 16 more than a row, so the 8 keys a B fragment
// reads (row stride 36 words: banks 4g + c) hit 32 distinct banks.
template <int HD>
constexpr int RowBytes() {
  return HD + 16;
}

__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint16_t two, __nv_fp8_interpretation_t kind) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, kind);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// D = A · B + D for one m16n8k16 tile (row-major A, column-major B): the GEMMs' own.
using tma::Mma;

// CTAs an SM must hold (registers capped to fit): a decode CTA is mostly latency (the block
// table, the first tile, the merge), so more of them in flight hide more of it. Wider CTAs keep
// the same warps an SM.
constexpr int MinBlocks(int hd, bool tiled, int warps) {
  const int blocks = ((hd == 128 ? 3 : 4) + (tiled ? 0 : 1)) * kDefaultWarps / warps;
  return blocks > 1 ? blocks : 1;
}

// Decode's merge buffer: a lane's Oᵀ fragments hold dims qg·kSpan.. (kSpan = HD / 8) of query
// heads 2qc, 2qc + 1, stored as float2. With rows HD floats apart the 32 lanes of a store hit 2
// banks (16-way conflicts); two floats after each lane's span and a row stride of 4 mod 16 put
// each half-warp on 16 distinct bank pairs. Measured (8B, 512 tokens, in-CTA timer stamps): the
// merge 2.0 → 1.8 µs at batch 16 (16 warps), 2.6 → 2.0 at batch 64; what is left there is the
// read loop over the warps' slots and the output stores.
template <int HD>
constexpr int DecodeMergeStride() {
  return (8 * (HD / 8 + 2) + 11) / 16 * 16 + 4;
}
// Offset of (row, dim d) in the decode merge buffer; row = warp · kDecodeMergeRows + query head.
template <int HD>
__device__ __forceinline__ int DecodeMergeAt(int row, int d) {
  return row * DecodeMergeStride<HD>() + d / (HD / 8) * (HD / 8 + 2) + d % (HD / 8);
}
constexpr int kDecodeMergeRows = 8;  // query heads a warp's Oᵀ covers (G ≤ 8)

// Decode: this warp's Oᵀ fragments (dims qg·kSpan + 2mt (+1), query heads 2qc, 2qc + 1), times
// o_scale, into its rows of the decode merge buffer at o_s.
template <int HD>
__device__ __forceinline__ void StoreDecodeO(float* o_s, int warp, const float (&o)[HD / 16][4], float o_scale) {
  const int lane = threadIdx.x & 31, qg = lane >> 2, qc = lane & 3;
  float* row_a = o_s + DecodeMergeAt<HD>(warp * kDecodeMergeRows + 2 * qc, qg * (HD / 8));
  float* row_b = row_a + DecodeMergeStride<HD>();  // head 2qc + 1
#pragma unroll
  for (int mt = 0; mt < HD / 16; ++mt) {
    *reinterpret_cast<float2*>(row_a + 2 * mt) = make_float2(o[mt][0] * o_scale, o[mt][2] * o_scale);
    *reinterpret_cast<float2*>(row_b + 2 * mt) = make_float2(o[mt][1] * o_scale, o[mt][3] * o_scale);
  }
}

// Row r's merge of kWarps warps' partial softmaxes at one element: warp w's max (log2 domain) and
// sum at ml_s[2(16w + r)], [+1], its unnormalised value at o_s[slot(w)]. A warp with max -inf had
// no key for the row and is skipped.
struct WarpMerge {
  float max, acc, sum;
};
template <int kWarps, typename Slot>
__device__ __forceinline__ WarpMerge MergeWarps(const float* o_s, const float* ml_s, int r, Slot slot) {
  WarpMerge out{-INFINITY, 0.0f, 0.0f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) out.max = fmaxf(out.max, ml_s[(w * 16 + r) * 2]);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float mw = ml_s[(w * 16 + r) * 2];
    if (mw == -INFINITY) continue;
    const float c = exp2f(mw - out.max);
    out.acc += o_s[slot(w)] * c;
    out.sum += ml_s[(w * 16 + r) * 2 + 1] * c;
  }
  return out;
}

// cluster_merge: after each CTA of the cluster (one a split, rank = split) has left its
// unnormalised output in acc_s[DecodeMergeAt(r, d)] and its max (log2 domain) and sum in
// ml_s[2r], [2r + 1] (max -inf: no keys, and then its values are garbage), CTA `rank` merges a
// share of the rows × HD outputs from every rank's shared memory and writes them. Shares are
// whole warps of one row (HD is a multiple of 32): lane s reads split s's max and sum, the warp
// turns them into weights by shuffles, and every lane reads its element from each split, all
// loads issued at once. The second barrier keeps each CTA's shared memory alive until every rank
// has read it.
template <int HD, typename Out>
__device__ __forceinline__ void ClusterMerge(float* acc_s, float* ml_s, int rows, int splits, Out&& final_at) {
  static_assert(HD % 32 == 0, "a warp's share lies in one row");
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int lane = threadIdx.x & 31;
  const int total = rows * HD, share = ((total + splits - 1) / splits + 31) & ~31;
  const int rank = static_cast<int>(cluster.block_rank()), stop = min(total, (rank + 1) * share);
  for (int base = rank * share + (threadIdx.x & ~31); base < stop; base += blockDim.x) {  // warp-uniform
    const int r = base / HD, i = base + lane;
    float m = -INFINITY, l = 0.0f;
    if (lane < splits) {
      const float* ml = cluster.map_shared_rank(ml_s, lane);
      m = ml[2 * r], l = ml[2 * r + 1];
    }
    const int at = DecodeMergeAt<HD>(r, i % HD);
    float as[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) as[s] = s < splits ? cluster.map_shared_rank(acc_s, s)[at] : 0.0f;
    const float mm = WarpMax(m);
    const float w = m == -INFINITY ? 0.0f : exp2f(m - mm);
    const float sum = WarpSum(w == 0.0f ? 0.0f : l * w);
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      const float ws = __shfl_sync(0xffffffffu, w, s);
      acc += ws == 0.0f ? 0.0f : as[s] * ws;
    }
    final_at(r)[i % HD] = __float2half(acc / sum);
  }
  cluster.sync();
}

// rope.inv_freq (decode): the row's projection at `row` (or the sum of rope.parts at row_offset)
// plus the bias, its q heads kv_head·group.. rotated into q_s[group][HD] and its K (rotated) and V
// into fresh[2][HD]. A thread a rotation pair, as RopeWriteKv computes it (same sums, same angle),
// so the cache bytes match the RoPE kernel's; threads [0, threads) take part. The caller syncs them
// before reading the results. kBatch: pairs a thread loads before it stores any (a store to a
// generic address may alias the next pair's loads, so one pair at a time is a round trip each).
template <int HD, int kBatch = 1>
__device__ __forceinline__ void RopeIntoShared(const float* row, const AttentionRope& rope, int64_t row_offset,
                                               float pos, int heads, int kvh, int group, int kv_head, float* q_s,
                                               float* fresh, int threads) {
  constexpr int kHalf = HD / 2;
  const float* src = rope.parts.count > 0 ? rope.parts.data + row_offset : row;
  const int parts = rope.parts.count > 0 ? rope.parts.count : 1;
  const int pairs = (group + 2) * kHalf;
  for (int base = threadIdx.x; base < pairs; base += kBatch * threads) {
    float a[kBatch], c[kBatch], freq[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int it = base + b * threads;
      if (b > 0 && it >= pairs) break;
      const int j = it / kHalf, i = it % kHalf;  // j < group: a q head; group: K; group + 1: V
      const int head = j < group ? kv_head * group + j : heads + (j - group) * kvh + kv_head;
      const int col = head * HD + i;
      a[b] = 0.0f, c[b] = 0.0f;
#pragma unroll
      for (int p = 0; p < kMaxPartials; ++p) {
        if (p < parts) a[b] += src[p * rope.parts.stride + col], c[b] += src[p * rope.parts.stride + col + kHalf];
      }
      if (rope.bias) a[b] += rope.bias[col], c[b] += rope.bias[col + kHalf];
      // With one pair a thread the frequency loads after the sums (PagedAttention's code, kept).
      if constexpr (kBatch > 1) freq[b] = j <= group ? rope.inv_freq[i] : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int it = base + b * threads;
      if (b > 0 && it >= pairs) break;
      const int j = it / kHalf, i = it % kHalf;
      if (j <= group) {
        float sn, cs;
        float f;
        if constexpr (kBatch > 1) {
          f = freq[b];
        } else {
          f = rope.inv_freq[i];
        }
        sincosf(pos * f, &sn, &cs);
        const float ra = a[b] * cs - c[b] * sn, rc = c[b] * cs + a[b] * sn;
        a[b] = ra, c[b] = rc;
      }
      float* dst = j < group ? q_s + j * HD : fresh + (j - group) * HD;
      dst[i] = a[b], dst[i + kHalf] = c[b];
    }
  }
}

template <int HD>
struct Stage {
  alignas(16) uint8_t k[kKeys * RowBytes<HD>()];
  alignas(16) uint8_t v[kKeys * RowBytes<HD>()];
};

// The lane's slot for IssueTileAt: key min(t0 + lane % 16, end - 1)'s.
__device__ __forceinline__ int64_t TileSlot(const int32_t* blocks, const KvGeometry& g, int t0, int end) {
  const int lane = threadIdx.x & 31;
  return CacheSlot(blocks, g.block_size, min(t0 + (lane & 15), end - 1));
}

// Starts copying the K and V rows of keys [t0, t0 + kKeys) of KV head kv_head into `stage`, and
// loads this lane's scale (lanes 0-15: K scale of key lane, 16-31: V scale of key lane - 16). Keys
// past `end` read the last valid key: finite values, masked out of the scores. Each lane looks up
// one key's slot (key lane & 15) and the pieces take theirs by shuffles: a lookup per piece put
// each copy behind its own block-table load, in the PTX one after the other. One commit group.
// kScaleToShared: scale_out is a warp's 32 floats of shared memory and the scale is copied into
// scale_out[lane] in the tile's group. A scale loaded into a register holds the warp at the first
// instruction that reads it (a loop's scale_cur = scale_next, right after the issue), about a
// DRAM round trip, so such a loop never has more than one tile's copies outstanding for long.
// IssueTileAt takes the lane's slot (TileSlot) already looked up, e.g. a compute earlier.
template <int HD, bool kScaleToShared = false>
__device__ __forceinline__ void IssueTileAt(Stage<HD>& stage, int64_t my_slot, const KvGeometry& g,
                                            const KvLayerView& layer, int kv_head, float* scale_out) {
  constexpr int kRow = RowBytes<HD>(), kPieces = kKeys * HD / 16, kPerLane = (kPieces + 31) / 32;
  const int lane = threadIdx.x & 31, kvh = g.kv_heads;
  const uint8_t* kbase = static_cast<const uint8_t*>(layer.k) + kv_head * HD;
  const uint8_t* vbase = static_cast<const uint8_t*>(layer.v) + kv_head * HD;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int piece = lane + 32 * i;
    const int key = piece / (HD / 16), part = piece % (HD / 16);
    const int64_t slot = __shfl_sync(0xffffffffu, my_slot, key);
    if (piece < kPieces) {
      const int64_t at = slot * kvh * HD + part * 16;
      __pipeline_memcpy_async(stage.k + key * kRow + part * 16, kbase + at, 16);
      __pipeline_memcpy_async(stage.v + key * kRow + part * 16, vbase + at, 16);
    }
  }
  if constexpr (kScaleToShared) {
    __pipeline_memcpy_async(scale_out + lane, &(lane < 16 ? layer.k_scale : layer.v_scale)[my_slot * kvh + kv_head], 4);
    __pipeline_commit();
  } else {
    __pipeline_commit();
    *scale_out = (lane < 16 ? layer.k_scale : layer.v_scale)[my_slot * kvh + kv_head];
  }
}

template <int HD, bool kScaleToShared = false>
__device__ __forceinline__ void IssueTile(Stage<HD>& stage, const int32_t* blocks, const KvGeometry& g,
                                          const KvLayerView& layer, int kv_head, int t0, int end, float* scale_out) {
  IssueTileAt<HD, kScaleToShared>(stage, TileSlot(blocks, g, t0, end), g, layer, kv_head, scale_out);
}

// The new position's K and V (fresh, fp32), encoded as RopeWriteKv would (scale = amax / max,
// clamps added to *clamped, the lane's), into the cache at `slot` and into k_row / v_row;
// new_scale: their scales. WriteNewKv's first half, for a warp with time to spare before the
// position's tile.
template <KvDtype D, int HD>
__device__ __forceinline__ void EncodeNewKv(const float (&fresh)[2][HD], uint8_t* k_row, uint8_t* v_row, int64_t slot,
                                            int kv_head, const KvGeometry& g, const KvLayerView& layer,
                                            float (&new_scale)[2], int* clamped) {
  using Codec = KvCodec<D>;
  const int lane = threadIdx.x & 31, kvh = g.kv_heads;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    constexpr int kPer = HD / 32;
    float x[kPer], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) x[j] = fresh[which][lane + 32 * j], amax = fmaxf(amax, fabsf(x[j]));
    const float sc = HeadScale<Codec>(WarpMax(amax)), inv = 1.0f / sc;
    new_scale[which] = sc;
    uint8_t* row = which ? v_row : k_row;
    uint8_t* cached = static_cast<uint8_t*>(which ? layer.v : layer.k) + (slot * kvh + kv_head) * HD;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const uint8_t byte = EncodeCounted<Codec>(x[j], inv, clamped).__x;
      cached[lane + 32 * j] = byte;
      row[lane + 32 * j] = byte;
    }
    if (lane == 0) (which ? layer.v_scale : layer.k_scale)[slot * kvh + kv_head] = sc;
  }
}

// WriteNewKv's second half, at the tile (in `stage`) whose key `key` is the new position, its row
// already written: the rows past it repeat the stale slot and are masked: their scores are
// dropped, but P · V still multiplies their V by 0 and a never-written slot may hold NaN bytes, so
// those V rows are zeroed (16-byte stores; rewriting them byte by byte cost the writer warp up to
// 128 stores a lane) and their scales (in *scale_cur, the lanes' scales of the tile's keys) set
// finite, the key's to new_scale.
template <int HD>
__device__ __forceinline__ void MaskPastNewKey(Stage<HD>& stage, int key, const float (&new_scale)[2],
                                               float* scale_cur) {
  constexpr int kRow = RowBytes<HD>();
  const int lane = threadIdx.x & 31;
  for (int i = lane; i < (kKeys - 1 - key) * (HD / 16); i += 32) {
    *reinterpret_cast<uint4*>(stage.v + (key + 1 + i / (HD / 16)) * kRow + i % (HD / 16) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
  if ((lane & 15) >= key) *scale_cur = lane < 16 ? new_scale[0] : new_scale[1];
}

// Decode with new_kv, the writer warp at the tile (in `stage`) holding the row's own position,
// its key `key`, cache slot `slot`: the tile's copy of it is stale. K and V are encoded into the
// cache and the tile's row (EncodeNewKv), the rows past it masked (MaskPastNewKey).
template <KvDtype D, int HD>
__device__ __forceinline__ void WriteNewKv(const float (&fresh)[2][HD], Stage<HD>& stage, int key, int64_t slot,
                                           int kv_head, const KvGeometry& g, const KvLayerView& layer,
                                           float* scale_cur, unsigned long long* clamps) {
  constexpr int kRow = RowBytes<HD>();
  int clamped = 0;
  float new_scale[2];
  EncodeNewKv<D, HD>(fresh, stage.k + key * kRow, stage.v + key * kRow, slot, kv_head, g, layer, new_scale, &clamped);
  MaskPastNewKey<HD>(stage, key, new_scale, scale_cur);
  if (clamped) atomicAdd(clamps, static_cast<unsigned long long>(clamped));
  __syncwarp();
}

// Decode's Oᵀ += Vᵀ · Pᵀ for one tile of V rows at vs, after o is rescaled by the rows' factor f
// (this lane's, of row qg). Decode fills only G ≤ 8 of the 16 mma rows, so it turns the product
// around: Oᵀ[dims × query heads] = Vᵀ · Pᵀ, with the dims as the 16 rows (half the mma and
// accumulators) and Pᵀ's fragment already in registers (pa[0], pa[2]: row qg, keys 2qc.. and
// 2qc + 8..). Vᵀ's fragment wants two keys at one dim per register, which the [key][dim] byte rows
// hold kRow apart; the dims are permuted so a lane's are contiguous instead (m-tile mt, row m: dim
// qg·kSpan + 2mt (+1 for m = qg + 8)): four vector loads of kSpan bytes, keys 2qc, 2qc + 1,
// 2qc + 8, 2qc + 9, then byte permutes pair the keys up.
template <KvDtype D, int HD>
__device__ __forceinline__ void DecodePv(const uint8_t* vs, const uint32_t (&pa)[4], float f, float (&o)[HD / 16][4]) {
  constexpr __nv_fp8_interpretation_t kKind = D == KvDtype::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3;
  constexpr int kRow = RowBytes<HD>(), kSpan = HD / 8, kWords = kSpan / 4;
  const int lane = threadIdx.x & 31, qg = lane >> 2, qc = lane & 3;
  uint32_t w[4][kWords];
  const uint8_t* vrow = vs + qg * kSpan;
  const int keys[4] = {2 * qc, 2 * qc + 1, 2 * qc + 8, 2 * qc + 9};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* src = vrow + keys[i] * kRow;
    if constexpr (kWords == 4) {
      const uint4 v4 = *reinterpret_cast<const uint4*>(src);
      w[i][0] = v4.x, w[i][1] = v4.y, w[i][2] = v4.z, w[i][3] = v4.w;
    } else if constexpr (kWords == 2) {
      const uint2 v2 = *reinterpret_cast<const uint2*>(src);
      w[i][0] = v2.x, w[i][1] = v2.y;
    } else {
      w[i][0] = *reinterpret_cast<const uint32_t*>(src);
    }
  }
  // Query heads 2qc and 2qc + 1 (this lane's Oᵀ columns) rescale by their rows' factors.
  const float fa = __shfl_sync(0xffffffffu, f, 8 * qc), fb = __shfl_sync(0xffffffffu, f, 8 * qc + 4);
#pragma unroll
  for (int mt = 0; mt < HD / 16; ++mt) {
    const uint32_t sel = (mt & 1) ? 0x7362u : 0x5140u;  // bytes 2mt, 2mt + 1 of x and y, interleaved
    const uint32_t lo = __byte_perm(w[0][mt / 2], w[1][mt / 2], sel);
    const uint32_t hi = __byte_perm(w[2][mt / 2], w[3][mt / 2], sel);
    const uint32_t a[4] = {Fp8x2ToHalf2(static_cast<uint16_t>(lo), kKind), Fp8x2ToHalf2(static_cast<uint16_t>(lo >> 16), kKind),
                           Fp8x2ToHalf2(static_cast<uint16_t>(hi), kKind), Fp8x2ToHalf2(static_cast<uint16_t>(hi >> 16), kKind)};
    o[mt][0] *= fa, o[mt][1] *= fb, o[mt][2] *= fa, o[mt][3] *= fb;
    Mma(o[mt], a, pa[0], pa[2]);
  }
}

// S = Q · Kᵀ over one tile of K rows at ks: n-tile j covers keys 8j .. 8j + 7; this lane's
// columns are keys 8j + 2qc, +1, in sc[j][0..1] for row qg and (two row halves) sc[j][2..3] for
// row qg + 8. qa[kc]: Q's A fragment of dims 16kc .. 16kc + 15, rows qg (and qg + 8).
template <KvDtype D, int HD, int kHalves>
__device__ __forceinline__ void QkScores(const uint8_t* ks, const uint32_t (&qa)[HD / 16][2 * kHalves],
                                         float (&sc)[2][4]) {
  constexpr __nv_fp8_interpretation_t kKind = D == KvDtype::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3;
  constexpr int kRow = RowBytes<HD>();
  const int lane = threadIdx.x & 31, qg = lane >> 2, qc = lane & 3;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
    const uint8_t* krow = ks + (8 * j + qg) * kRow + 2 * qc;
#pragma unroll
    for (int kc = 0; kc < HD / 16; ++kc) {
      const uint32_t b0 = Fp8x2ToHalf2(*reinterpret_cast<const uint16_t*>(krow + kc * 16), kKind);
      const uint32_t b1 = Fp8x2ToHalf2(*reinterpret_cast<const uint16_t*>(krow + kc * 16 + 8), kKind);
      const uint32_t a[4] = {qa[kc][0], kHalves == 2 ? qa[kc][1] : 0u, qa[kc][kHalves],
                             kHalves == 2 ? qa[kc][kHalves + 1] : 0u};
      Mma(sc[j], a, b0, b1);
    }
  }
}

constexpr int StageBytes(int hd, int warps) { return warps * 2 * 2 * kKeys * (hd + 16); }

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
  constexpr __nv_fp8_interpretation_t kKind = D == KvDtype::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3;
  constexpr int kRow = RowBytes<HD>();
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
    float m[kHalves], l[kHalves];  // rows qg (+ 8); O holds O_true / o_scale
#pragma unroll
    for (int h = 0; h < kHalves; ++h) m[h] = -INFINITY, l[h] = 0.0f;
    float o_scale = 1.0f;

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
      // Scales of this lane's four keys (8j + 2qc + e) from the lanes that loaded them.
      float p[kHalves][2][2], vsc[2][2];
      float tmax[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) tmax[h] = -INFINITY;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * qc + e, at = t0 + key;
          const float kscale = __shfl_sync(0xffffffffu, scale_cur, key);
          vsc[j][e] = __shfl_sync(0xffffffffu, scale_cur, 16 + key);
#pragma unroll
          for (int h = 0; h < kHalves; ++h) {
            const bool ok = at < end && (!kTiled || (row_ok[h] && at <= row_pos[h] && at >= row_lo[h]));
            p[h][j][e] = ok ? sc[j][2 * h + e] * kscale : -INFINITY;
            tmax[h] = fmaxf(tmax[h], p[h][j][e]);
          }
        }
      }
      float vmax = fmaxf(fmaxf(vsc[0][0], vsc[0][1]), fmaxf(vsc[1][0], vsc[1][1]));
#pragma unroll
      for (int o2 = 1; o2 < 4; o2 <<= 1) {
#pragma unroll
        for (int h = 0; h < kHalves; ++h) tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], o2));
        vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o2));
      }
      // P's A fragment: pa[2j + h] holds row qg + 8h, keys 8j + 2qc, +1, with the V scales folded
      // in relative to vmax. A row that no key of this tile reaches yet (causal) keeps m = -inf:
      // exponentiate against 0 then, so it adds nothing instead of NaN.
      uint32_t pa[4] = {0u, 0u, 0u, 0u};
      float f[kHalves];
      const float inv_vmax = 1.0f / vmax;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const float m_new = fmaxf(m[h], tmax[h]);
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2f(m[h] - m_ref);
        float psum = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float e0 = exp2f(p[h][j][0] - m_ref), e1 = exp2f(p[h][j][1] - m_ref);
          psum += e0 + e1;
          pa[2 * j + h] = PackHalf2(e0 * vsc[j][0] * inv_vmax, e1 * vsc[j][1] * inv_vmax);
        }
        l[h] = l[h] * corr + psum;
        m[h] = m_new;
        f[h] = corr * o_scale * inv_vmax;  // O (units of o_scale) → units of this tile's vmax
      }
      o_scale = vmax;
      if constexpr (kTiled) {
#pragma unroll
        for (int t = 0; t < kDimTiles; ++t) {
          o[t][0] *= f[0], o[t][1] *= f[0];
          o[t][2] *= f[kHalves - 1], o[t][3] *= f[kHalves - 1];
          // B fragment: V[keys 2qc, 2qc + 1][dim 8t + qg] and keys 2qc + 8, + 9.
          const uint8_t* vcol = vs + 8 * t + qg;
          const uint16_t lo0 = vcol[(2 * qc) * kRow], hi0 = vcol[(2 * qc + 1) * kRow];
          const uint16_t lo1 = vcol[(2 * qc + 8) * kRow], hi1 = vcol[(2 * qc + 9) * kRow];
          const uint32_t b0 = Fp8x2ToHalf2(static_cast<uint16_t>(lo0 | (hi0 << 8)), kKind);
          const uint32_t b1 = Fp8x2ToHalf2(static_cast<uint16_t>(lo1 | (hi1 << 8)), kKind);
          Mma(o[t], pa, b0, b1);
        }
      } else {
        DecodePv<D, HD>(vs, pa, f[0], o);
      }
      scale_cur = scale_next;
      __syncwarp();  // this stage is refilled by the next iteration's issue
    }
    __pipeline_wait_prior(0);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }

    // Merge the warps' partial softmaxes through the stage buffers.
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int r = qg + 8 * h;
      if constexpr (kTiled) {
#pragma unroll
        for (int t = 0; t < kDimTiles; ++t) {
          o_s[(warp * 16 + r) * HD + 8 * t + 2 * qc] = o[t][2 * h] * o_scale;
          o_s[(warp * 16 + r) * HD + 8 * t + 2 * qc + 1] = o[t][2 * h + 1] * o_scale;
        }
      }
      if (qc == 0) ml_s[(warp * 16 + r) * 2] = m[h], ml_s[(warp * 16 + r) * 2 + 1] = l[h];
    }
    if constexpr (!kTiled) StoreDecodeO<HD>(o_s, warp, o, o_scale);
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
