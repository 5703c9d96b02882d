#pragma once
// Decode's new position on the tensor-core attention: q and the new K rotated from the q/k/v
// projection (RoPE in the attention, no RoPE kernel), and the new K/V encoded into the cache and
// into the tile that holds the position, as RopeWriteKv would.
#include "worker/backends/cuda/kernels/attention_mma_tiles.cuh"

namespace tailserve::cuda {
namespace mma_attention {

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

}  // namespace mma_attention
}  // namespace tailserve::cuda
