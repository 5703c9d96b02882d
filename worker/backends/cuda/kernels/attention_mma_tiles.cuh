#pragma once
// The tensor-core attention's building blocks (attention_mma.cuh says what the kernel does): key
// tiles copied into a warp's stage buffers, Q · Kᵀ and P · V on the tensor cores, and the online
// softmax between them. Shared by attention_mma.cuh and the attention block.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline_primitives.h>

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

// Prefill's O += P · V for one tile of V rows at vs, after o's row halves are rescaled by their
// factors f (rows qg and qg + 8). All 16 mma rows hold tokens, so P's fragment is the A operand as
// it is; the B fragment wants V[keys 2qc, 2qc + 1][dim 8t + qg] (and keys 2qc + 8, + 9), one byte
// of each key's row, paired into fp16x2.
template <KvDtype D, int HD>
__device__ __forceinline__ void PrefillPv(const uint8_t* vs, const uint32_t (&pa)[4], const float (&f)[2],
                                          float (&o)[HD / 8][4]) {
  constexpr __nv_fp8_interpretation_t kKind = D == KvDtype::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3;
  constexpr int kRow = RowBytes<HD>();
  const int lane = threadIdx.x & 31, qg = lane >> 2, qc = lane & 3;
#pragma unroll
  for (int t = 0; t < HD / 8; ++t) {
    o[t][0] *= f[0], o[t][1] *= f[0];
    o[t][2] *= f[1], o[t][3] *= f[1];
    const uint8_t* vcol = vs + 8 * t + qg;
    const uint16_t lo0 = vcol[(2 * qc) * kRow], hi0 = vcol[(2 * qc + 1) * kRow];
    const uint16_t lo1 = vcol[(2 * qc + 8) * kRow], hi1 = vcol[(2 * qc + 9) * kRow];
    const uint32_t b0 = Fp8x2ToHalf2(static_cast<uint16_t>(lo0 | (hi0 << 8)), kKind);
    const uint32_t b1 = Fp8x2ToHalf2(static_cast<uint16_t>(lo1 | (hi1 << 8)), kKind);
    Mma(o[t], pa, b0, b1);
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

// The online softmax of a warp's rows over its key tiles, in the exp2 domain. Each tile's V
// scales fold into P relative to the tile's largest (so P stays in fp16's normal range); O
// carries that factor from tile to tile: O holds O_true / o_scale.
struct SoftmaxState {
  float m[2] = {-INFINITY, -INFINITY};  // rows qg (+ 8): the running max
  float l[2] = {0.0f, 0.0f};            // the running sum (this lane's keys)
  float o_scale = 1.0f;
};

// A tile's key and V scales as this lane's four keys (8j + 2qc + e) need them.
struct TileScales {
  float vsc[2][2];  // V scale of key 8j + 2qc + e
  float vmax;       // the tile's largest V scale (the lane quad's)
  float tmax[2];    // row half h's largest scaled score (the lane quad's)
};

// Scores of one tile (sc as QkScores / DecodeQkScores leave them: row half h's keys 8j + 2qc + e
// in sc[j][2h + e]) times their keys' K scales into p, -inf where ok(h, key index) is false;
// scale_cur: lanes 0-15 hold the tile's K scales, 16-31 its V scales (IssueTile).
template <int kHalves, typename Ok>
__device__ __forceinline__ TileScales ScaleScores(const float (&sc)[2][4], float scale_cur, Ok&& ok, int t0,
                                                  float (&p)[kHalves][2][2]) {
  const int qc = threadIdx.x & 3;
  TileScales ts;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) ts.tmax[h] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = 8 * j + 2 * qc + e, at = t0 + key;
      const float kscale = __shfl_sync(0xffffffffu, scale_cur, key);
      ts.vsc[j][e] = __shfl_sync(0xffffffffu, scale_cur, 16 + key);
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        p[h][j][e] = ok(h, at) ? sc[j][2 * h + e] * kscale : -INFINITY;
        ts.tmax[h] = fmaxf(ts.tmax[h], p[h][j][e]);
      }
    }
  }
  ts.vmax = fmaxf(fmaxf(ts.vsc[0][0], ts.vsc[0][1]), fmaxf(ts.vsc[1][0], ts.vsc[1][1]));
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) ts.tmax[h] = fmaxf(ts.tmax[h], __shfl_xor_sync(0xffffffffu, ts.tmax[h], o2));
    ts.vmax = fmaxf(ts.vmax, __shfl_xor_sync(0xffffffffu, ts.vmax, o2));
  }
  return ts;
}

// One tile's step of the online softmax: P's A fragment (pa[2j + h]: row qg + 8h, keys 8j + 2qc,
// +1, the V scales folded in relative to vmax) and f[h], the factor row half h's O must be
// multiplied by before this tile's P · V is added (O in units of o_scale → of this tile's vmax).
// A row that no key of this tile reaches yet (causal) keeps m = -inf: exponentiate against 0 then,
// so it adds nothing instead of NaN.
template <int kHalves>
__device__ __forceinline__ void SoftmaxStep(const float (&p)[kHalves][2][2], const TileScales& ts, SoftmaxState* st,
                                            uint32_t (&pa)[4], float (&f)[kHalves]) {
  const float inv_vmax = 1.0f / ts.vmax;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    const float m_new = fmaxf(st->m[h], ts.tmax[h]);
    const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = exp2f(st->m[h] - m_ref);
    float psum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float e0 = exp2f(p[h][j][0] - m_ref), e1 = exp2f(p[h][j][1] - m_ref);
      psum += e0 + e1;
      pa[2 * j + h] = PackHalf2(e0 * ts.vsc[j][0] * inv_vmax, e1 * ts.vsc[j][1] * inv_vmax);
    }
    st->l[h] = st->l[h] * corr + psum;
    st->m[h] = m_new;
    f[h] = corr * st->o_scale * inv_vmax;
  }
  st->o_scale = ts.vmax;
}

}  // namespace mma_attention
}  // namespace tailserve::cuda
