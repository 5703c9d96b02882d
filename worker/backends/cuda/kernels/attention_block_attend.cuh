#pragma once
// The attention block's attention: CTA i of group g attends for row i (attention_block.h). Its
// eight consumer warps stream the row's key tiles (the first two a warp copied before the
// previous kernel is done), the warp after the writer encodes the new position's K/V into the
// cache, each warp runs the online softmax over its tiles, and the warps merge the group's heads
// into p.attn, then count the row attended.
#include "worker/backends/cuda/kernels/attention_block_shared.cuh"

namespace tailserve::cuda::attention_block {

using mma_attention::kKeys;
using mma_attention::kLog2e;
using mma_attention::Mma;
using mma_attention::PackHalf2;

// S = Q · Kᵀ over one tile of K rows at ks, as mma_attention::QkScores<D, HD, 1> leaves it (n-tile
// j: keys 8j + 2qc, +1 of row qg in sc[j][0..1]), but with the head dims permuted: a sum over dims
// may take them in any order that Q and K share. Chunk kc's k-columns 2qc, 2qc + 1 (+8, +9) are dims
// HD/4·qc + 4kc + 0, 1 (2, 3), so each lane's K bytes of a key are HD/4 contiguous bytes: vector
// loads (two of 16 B at head_dim 128, against 16 loads of 2 B), conflict-free at the 8B row stride.
// Each n-tile's products go into two accumulators (even and odd chunks): two mma chains of
// HD/32 instead of one of HD/16, since a decode warp's tile compute is latency-bound. Measured
// (H100, 16 rows, 512 tokens): a tile's compute 1700-1875 → 1535-1700 SM cycles
// (docs/cuda-decode.md).
template <KvDtype D, int HD>
__device__ __forceinline__ void DecodeQkScores(const uint8_t* ks, const uint32_t (&qa)[HD / 16][2], float (&sc)[2][4]) {
  constexpr __nv_fp8_interpretation_t kKind = D == KvDtype::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3;
  constexpr int kRow = mma_attention::RowBytes<HD>(), kChunks = HD / 16;
  static_assert(kChunks % 2 == 0, "two accumulators");
  const int lane = threadIdx.x & 31, qg = lane >> 2, qc = lane & 3;
  uint32_t w[2][kChunks];  // [n-tile][chunk]: K bytes of dims HD/4·qc + 4kc .. + 3 of key 8j + qg
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint8_t* src = ks + (8 * j + qg) * kRow + qc * (HD / 4);
    if constexpr (kChunks >= 4) {
#pragma unroll
      for (int v = 0; v < kChunks / 4; ++v) {
        const uint4 x = reinterpret_cast<const uint4*>(src)[v];
        w[j][4 * v] = x.x, w[j][4 * v + 1] = x.y, w[j][4 * v + 2] = x.z, w[j][4 * v + 3] = x.w;
      }
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(src);
      w[j][0] = x.x, w[j][1] = x.y;
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      const uint32_t b0 = mma_attention::Fp8x2ToHalf2(static_cast<uint16_t>(w[j][kc]), kKind);
      const uint32_t b1 = mma_attention::Fp8x2ToHalf2(static_cast<uint16_t>(w[j][kc] >> 16), kKind);
      const uint32_t a[4] = {qa[kc][0], 0u, qa[kc][1], 0u};
      Mma(kc % 2 ? odd : sc[j], a, b0, b1);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[j][e] += odd[e];
  }
}

// The consumer warps' part up to o: the key tiles asked for before the wait (W_o's stream waits
// for the last ask, keys_issued_s), the wait for the previous kernel, then for a CTA with a row
// (ci < rows) the row's attention, merged and written to p.attn, and the group's count.
template <KvDtype D, int HD>
__device__ __forceinline__ void Attend(const Params& p, const Shared<HD>& sm, int ci, int g) {
  constexpr int kChunks = HD / 16;
  constexpr int kOTiles = HD / 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int qg = lane >> 2, qc = lane & 3;
  // The row this CTA attends for, if any, and its first two key tiles a warp, copied now so that
  // they arrive while the previous kernel finishes. The new position's slot is stale in them until
  // the writer below overwrites it.
  const bool attends = ci < p.rows;
  const int r0 = ci;
  const int pos0 = attends ? p.meta.pos[r0] : 0;
  const int begin = p.sliding_window > 0 ? max(0, pos0 - p.sliding_window + 1) : 0, end = pos0 + 1;
  const int kvh = p.kvh, group = p.group;
  const int32_t* blocks = attends ? BlockTableRow(p.meta, p.g, r0) : nullptr;
  const int t_first = begin + warp * kKeys;
  // With the row's tiles 8n + r (0 < r, n >= 2), warps 0 .. r - 1 hold n + 1 tiles and the last of
  // them (the writer's: the row's last tile) would be asked late, when o's W floods the DRAM (4 µs
  // in flight on the slowest CTAs against 1.3). Those warps copy their last tile first, into an
  // aux stage of their own (aux is idle until o); the loop's refill that would have copied it
  // commits an empty group. With the new K/V encoded off the writer: keys computed max 18.7 → 14.6
  // µs on the H100 (docs/cuda-decode.md).
  const int row_tiles = attends ? (end - begin + kKeys - 1) / kKeys : 0;
  const bool last_early = row_tiles / kWarps >= 2 && row_tiles % kWarps > warp &&
                          row_tiles % kWarps <= min(kWarps - 1, kAuxBytes / static_cast<int>(sizeof(Stage<HD>)));
  const int t_last = last_early ? t_first + row_tiles / kWarps * kWarps * kKeys : -1;  // its key
  Stage<HD>& last_stage = *reinterpret_cast<Stage<HD>*>(sm.aux + warp * sizeof(Stage<HD>));
  // Lane 0 arrives once at keys_issued_s, at the warp's last ask (at once if it has none): its last
  // tile, or with last_early the one before it.
  if (lane == 0 && (!attends || t_first >= end)) tma::BarrierArrive(sm.keys_issued_s);
  // Copies the tile at key t into key stage s, its scales into scale_s[warp][s]: one commit group,
  // an empty one past the row's end, so that when the loop waits for a tile, one group was
  // committed after its own. slot: the lane's TileSlot, if already looked up (else -1).
  auto issue = [&](int t, int s, int64_t slot = -1) {
    if (t == t_last) {  // copied first: an empty group, and its stamps stay the copy's
      __pipeline_commit();
      return;
    }
    TileStamp(p, t, t_first, 0);
    if (t < end) {
      mma_attention::IssueTileAt<HD, true>(sm.stages[warp][s],
                                           slot >= 0 ? slot : mma_attention::TileSlot(blocks, p.g, t, end), p.g,
                                           p.layer, g, sm.scale_s[warp][s]);
      const bool last_ask = last_early ? t + kWarps * kKeys == t_last : t + kWarps * kKeys >= end;
      if (lane == 0 && last_ask) tma::BarrierArrive(sm.keys_issued_s);
    } else {
      __pipeline_commit();  // past the row: an empty group
    }
    TileStamp(p, t, t_first, 1);
  };
  int t0 = t_first;
  if (attends) {
    if (last_early) {  // its own group, before tile 0's: the loop's waits still hold
      TileStamp(p, t_last, t_first, 0);
      mma_attention::IssueTileAt<HD, true>(last_stage, mma_attention::TileSlot(blocks, p.g, t_last, end), p.g,
                                           p.layer, g, sm.scale_s[warp][kLastScales]);
      TileStamp(p, t_last, t_first, 1);
    }
    for (int s = 0; s < kKeyStages; ++s) issue(t0 + s * kWarps * kKeys, s);
  }
  GridDependencyWait();  // x, the cache, the q/k/v partials and the scratch buffers are the previous kernels' before
  if (!attends) return;

  if (tid == 0) Stamp(p, 2);
  ConsumerSync();
  const AttentionRope rope{.inv_freq = p.inv_freq, .parts = p.parts, .bias = p.bias};
  // Two rotation pairs a thread (384 at the 8B shape over 256 threads), loaded together.
  mma_attention::RopeIntoShared<HD, 2>(nullptr, rope, static_cast<int64_t>(r0) * p.qkvw, static_cast<float>(pos0),
                                       p.heads, kvh, group, g, sm.q_s, &(*sm.fresh_s)[0][0], kWarps * 32);
  ConsumerSync();
  if (tid == 0) Stamp(p, 7);
  // Q fragments (scaled into the exp2 domain): row qg is query head qg of the group, its dims as
  // DecodeQkScores takes K's (chunk kc: dims HD/4·qc + 4kc .. + 3).
  uint32_t qa[kChunks][2];
  {
    const float qs = p.scale * kLog2e;
    const float* qrow = sm.q_s + (qg % group) * HD;
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      if (qg < group) {
        const float* q4 = qrow + qc * (HD / 4) + 4 * kc;
        qa[kc][0] = PackHalf2(q4[0] * qs, q4[1] * qs);
        qa[kc][1] = PackHalf2(q4[2] * qs, q4[3] * qs);
      } else {
        qa[kc][0] = qa[kc][1] = 0u;
      }
    }
  }
  const int writer_warp = (pos0 - begin) / kKeys % kWarps;
  const bool writer = warp == writer_warp;
  // The warp after the writer encodes the new K and V (and writes them to the cache) now and hands
  // them over through new_row_s / new_scale_s and a named barrier. The writer holds the row's last
  // tile, so it has as many tiles as any warp, and encoding at its tile (WriteNewKv) cost it ~1 µs;
  // the warp after it has one tile fewer unless the row's tiles are a multiple of kWarps.
  if (warp == (writer_warp + 1) % kWarps) {
    float scales[2];
    int clamped = 0;
    mma_attention::EncodeNewKv<D, HD>(*sm.fresh_s, sm.new_row_s[0], sm.new_row_s[1],
                                      CacheSlot(blocks, p.g.block_size, pos0), g, p.g, p.layer, scales, &clamped);
    if (clamped) atomicAdd(p.clamps, static_cast<unsigned long long>(clamped));
    if (lane == 0) sm.new_scale_s[0] = scales[0], sm.new_scale_s[1] = scales[1];
    asm volatile("bar.arrive %0, %1;" ::"n"(kNewKvBarrier), "n"(64) : "memory");  // release: the row is written
  }
  float o[kOTiles][4];
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  mma_attention::SoftmaxState sm_state;
  for (int s = 0; t0 < end; s ^= 1, t0 += kWarps * kKeys) {
    __pipeline_wait_prior(1);  // this tile's group and every older one have landed
    __syncwarp();
    TileStamp(p, t0, t_first, 2);
    const long long landed_clock = Timed(p.timeline) ? clock64() : 0;
    // The block-table lookup of the tile this one's stage takes next, now, so that its round trip
    // passes under this tile's compute instead of delaying the copy.
    const int t_refill = t0 + kKeyStages * kWarps * kKeys;
    int64_t refill_slot = -1;
    if (t_refill < end && t_refill != t_last) refill_slot = mma_attention::TileSlot(blocks, p.g, t_refill, end);
    Stage<HD>& stage = t0 == t_last ? last_stage : sm.stages[warp][s];
    float scale_cur = sm.scale_s[warp][t0 == t_last ? kLastScales : s][lane];
    if (writer && t0 <= pos0 && pos0 < t0 + kKeys) {  // the tile's copy of the new key is stale
      asm volatile("bar.sync %0, %1;" ::"n"(kNewKvBarrier), "n"(64) : "memory");  // the encoder's row
      constexpr int kRow = mma_attention::RowBytes<HD>(), kWords = HD / 4;
      for (int i = lane; i < 2 * kWords; i += 32) {
        const int which = i / kWords, w = i % kWords;
        *reinterpret_cast<uint32_t*>((which ? stage.v : stage.k) + (pos0 - t0) * kRow + 4 * w) =
            *reinterpret_cast<const uint32_t*>(&sm.new_row_s[which][4 * w]);
      }
      const float new_scale[2] = {sm.new_scale_s[0], sm.new_scale_s[1]};
      mma_attention::MaskPastNewKey<HD>(stage, pos0 - t0, new_scale, &scale_cur);
      __syncwarp();
    }
    // S = Q · Kᵀ (keys 8j + 2qc, +1 of row qg in sc[j][0..1]), then the online softmax with the V
    // scales folded into P, then Oᵀ += Vᵀ · Pᵀ: attention_mma.cuh's decode path.
    float sc[2][4];
    DecodeQkScores<D, HD>(stage.k, qa, sc);
    float pr[1][2][2];
    const mma_attention::TileScales ts = mma_attention::ScaleScores<1>(
        sc, scale_cur, [&](int, int at) { return at < end; }, t0, pr);
    uint32_t pa[4] = {0u, 0u, 0u, 0u};
    float f[1];
    mma_attention::SoftmaxStep<1>(pr, ts, &sm_state, pa, f);
    mma_attention::DecodePv<D, HD>(stage.v, pa, f[0], o);
    TileStamp(p, t0, t_first, 3);
    if (Timed(p.timeline)) TileStamp(p, t0, t_first, 4, clock64() - landed_clock);
    __syncwarp();  // every lane is done with this stage: its next tile
    issue(t_refill, s, refill_slot);
  }
  __pipeline_wait_prior(0);
  float l = sm_state.l[0];
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  // Merge the warps' partial softmaxes through the key buffers, write the group's heads.
  float* o_s = reinterpret_cast<float*>(&sm.stages[0][0]);
  float* ml_s = o_s + kWarps * 16 * HD;
  static_assert(sizeof(Stage<HD>) * kWarps * 2 >= (kWarps * 16 * HD + kWarps * 32) * sizeof(float), "merge buffer");
  ConsumerSync();
  if (tid == 0) Stamp(p, 8);
  if (qc == 0) ml_s[(warp * 16 + qg) * 2] = sm_state.m[0], ml_s[(warp * 16 + qg) * 2 + 1] = l;
  mma_attention::StoreDecodeO<HD>(o_s, warp, o, sm_state.o_scale);
  ConsumerSync();
  __half* out = p.attn + (static_cast<int64_t>(r0) * p.heads + g * group) * HD;
  for (int i = tid; i < group * HD; i += kWarps * 32) {
    const int r = i / HD, d = i % HD;
    const mma_attention::WarpMerge w = mma_attention::MergeWarps<kWarps>(o_s, ml_s, r, [&](int w2) {
      return mma_attention::DecodeMergeAt<HD>(w2 * mma_attention::kDecodeMergeRows + r, d);
    });
    out[i] = __float2half(w.acc / w.sum);
  }
  ConsumerSync();
  if (tid == 0) {
    Stamp(p, 9);
    __threadfence();
    atomicAdd(p.counters + g, 1);
    Stamp(p, 3);
  }
}

}  // namespace tailserve::cuda::attention_block
