#pragma once
// Merging the tensor-core attention's partial softmaxes: a CTA's warps in shared memory, and (at
// batch 1) a row's splits as one thread-block cluster through distributed shared memory.
#include <cooperative_groups.h>

#include "worker/backends/cuda/kernels/attention_mma_tiles.cuh"

namespace tailserve::cuda {
namespace mma_attention {

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

}  // namespace mma_attention
}  // namespace tailserve::cuda
