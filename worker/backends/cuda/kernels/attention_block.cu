#include "worker/backends/cuda/kernels/attention_block.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/attention_mma.cuh"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/tma.cuh"
#include "worker/backends/cuda/per_device.h"

namespace tailserve::cuda {
namespace {

using mma_attention::DecodeMergeAt;
using mma_attention::kDecodeMergeRows;
using mma_attention::kKeys;
using mma_attention::kLog2e;
using mma_attention::Mma;
using mma_attention::PackHalf2;
using mma_attention::Stage;
using tma::Swizzled;

constexpr int kWarps = 8;                      // consumer warps: the GEMM's MMAs and the attention
constexpr int kThreads = (kWarps + 1) * 32;    // + the producer warp
static_assert(kWarps == kAttentionBlockStampedWarps, "the timeline has a warp's tiles for each consumer warp");
constexpr int kMaxRows = 16;                   // an MMA's n: the rows ride in one m16n8k16 B fragment pair
constexpr int kMaxGroupCtas = 16;              // S, the CTAs of a KV-head group
constexpr int kBoxBytes = 16 * tma::kBoxK * 2;  // a 16-row box of 64 k: 2 KB
// A stage of the ring. q/k/v: kQkvBoxes k boxes, each up to kMaxQkvTiles 16-row W tiles and the
// 16 rows of xn; o: one k box of the CTA's ≤ 256 W_o rows (32 KB). Four stages leave room for the
// attention's key tiles and the merge.
constexpr int kQkvBoxes = 4, kMaxQkvTiles = 3;
constexpr int kQkvWBytes = kQkvBoxes * kMaxQkvTiles * kBoxBytes;  // 24 KB
constexpr int kStageBytes = kQkvWBytes + kQkvBoxes * kBoxBytes;    // 32 KB (a multiple of 1024)
constexpr int kStages = 4;
constexpr int kMaxOTiles = 16;                 // o's 16-row tiles a CTA (≤ 256 rows: one TMA box)
constexpr int kAuxBytes = 16 * 1024;           // q/k/v's cross-warp sums, then o's 16 input rows
constexpr int kMaxGroupDims = kAuxBytes / (kMaxRows * 2);  // G · head_dim: o's k a group, 512

// Without key tiles copied during q/k/v (early_key_tiles 0) the key buffers hold more stages of
// q/k/v's ring: kStages + this many. o's stages start in the first kStages (its W streams during
// the attention, whose key tiles then fill those buffers); with q/k/v given and late_o they grow
// into these buffers once the attention is merged.
template <int HD>
constexpr int KeyBufferStages() {
  return kWarps * 2 * static_cast<int>(sizeof(Stage<HD>)) / kStageBytes;
}
constexpr int kMaxStages = kStages + 2;
static_assert(KeyBufferStages<128>() <= kMaxStages - kStages, "the barriers cover every stage");

// Key tiles in flight a warp (AttentionBlockArgs::key_stages): two in the key buffers; with q/k/v
// given, more in the ring stages o leaves unused and in the aux buffer, idle until o's phase.
constexpr int kMaxKeyStages = 4;
template <int HD>
constexpr int RingKeyStages(int ring_stages) {  // extra key stages that fit the ring's unused stages
  return (ring_stages < kStages ? (kStages - ring_stages) * kStageBytes : 0) / static_cast<int>(sizeof(Stage<HD>));
}
template <int HD>
constexpr int MaxKeyStages(int ring_stages) {
  const int room = RingKeyStages<HD>(ring_stages) + kAuxBytes / static_cast<int>(sizeof(Stage<HD>));
  return std::min(kMaxKeyStages, 2 + room / kWarps);
}
static_assert(kWarps * 2 * 16 * 20 * 4 <= kWarps * 2 * static_cast<int>(sizeof(Stage<32>)),
              "o's products of every warp (16 rows 20 floats apart, two tiles) fit the key buffers");

template <int HD>
constexpr int SmemBytes() {
  return 1024 + kStages * kStageBytes + kWarps * 2 * static_cast<int>(sizeof(Stage<HD>)) + 8 * HD * 4 + kAuxBytes;
}
// The kernel's static shared memory: the ring's barriers, keys_done_s and keys_issued_s, the fresh
// K/V and its encoded row, the key tiles' scales (alignment included).
template <int HD>
constexpr int StaticSmemBytes() {
  return (2 * kMaxStages + 3) * 8 + 2 * HD * 4 + 2 * HD + 2 * 4 + kWarps * kMaxKeyStages * 32 * 4;
}
static_assert(16 * kMaxOTiles * 128 <= kStageBytes, "o's W box fits a stage");
static_assert(SmemBytes<128>() + StaticSmemBytes<128>() <= 227 * 1024, "one CTA an SM");

struct Params {
  int rows, hidden, heads, kvh, group, qkvw, qd, ctas;  // ctas: S
  int qkv_tiles;   // 16-row tiles of q/k/v columns a group: (G + 2) · head_dim / 16
  int o_tiles;     // 16-row tiles of W_o a CTA
  int qkv_steps;   // stages of q/k/v: hidden / (64 · kQkvBoxes); 0: q/k/v given (parts)
  int o_boxes;     // stages of o: G · head_dim / 64
  int sliding_window;
  float scale;
  const float* bias;
  const float* inv_freq;
  Partials parts;  // AttentionBlockArgs::qkv_parts
  RowMeta meta;
  KvGeometry g;
  KvLayerView layer;
  float* qkv;
  __half* attn;
  float* x;
  unsigned long long* clamps;
  int* counters;  // [kvh]: q/k/v CTAs done a group; [kvh, 2 kvh): rows attended; [2 kvh]: CTAs finished
  bool overlap;
  uint64_t* timeline;  // AttentionBlockArgs::timeline
  int stages;          // q/k/v's ring stages, 2..kStages (+ KeyBufferStages, AttentionBlockArgs::ring_stages)
  int early_tiles;     // AttentionBlockArgs::early_key_tiles
  bool wide;           // AttentionBlockArgs::wide_boxes
  bool vector_adds;    // AttentionBlockArgs::vector_adds
  int key_stages;      // AttentionBlockArgs::key_stages
  int ring_key_stages;  // of the key stages past each warp's first two, how many the ring holds (RingKeyStages)
  // o's ring: o_ring stages, the first min(stages, kStages) from the start; with late_o (q/k/v
  // given, AttentionBlockArgs::late_o_stages) also the ring's other stages and the key buffers'
  // once the CTA's attention is merged.
  int o_ring;
  bool late_o;
  bool o_waits;  // AttentionBlockArgs::o_waits_for_keys, with q/k/v given
};

// The CTA's timeline slot `which` (AttentionBlockArgs::timeline) = value; the caller checks for a timeline.
__device__ __forceinline__ void Record(const Params& p, int which, uint64_t value) {
  p.timeline[(blockIdx.y * gridDim.x + blockIdx.x) * kAttentionBlockStamps + which] = value;
}

__device__ __forceinline__ void Stamp(const Params& p, int which) {
  if (p.timeline == nullptr) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  Record(p, which, t);
}

// Lane 0 stamps event e (AttentionBlockArgs::timeline) of the warp's key tile at key t, the
// warp's first at t_first: where a tile's time goes (block-table load, landing, compute).
// cycles ≥ 0: event e is that count, not a time.
__device__ __forceinline__ void TileStamp(const Params& p, int t, int t_first, int e, long long cycles = -1) {
  if (p.timeline == nullptr || (threadIdx.x & 31) != 0) return;
  const int warp = threadIdx.x >> 5, tile = (t - t_first) / (kWarps * mma_attention::kKeys);
  if (tile >= kAttentionBlockStampedTiles) return;
  const int which = kAttentionBlockCtaStamps + (warp * kAttentionBlockStampedTiles + tile) * kAttentionBlockTileEvents + e;
  if (cycles >= 0) {
    Record(p, which, cycles);
  } else {
    Stamp(p, which);
  }
}

// Ring step st (q/k/v's steps, then o's) uses stage StageOf(st); UsesBefore(st) earlier steps
// used that stage, so it is that stage's phase st waits for (mod 2). o's steps cycle p.o_ring
// stages: the first min(stages, kStages), with late_o also the rest of the ring and the key
// buffers' (their first use waits for keys_done_s).
__device__ __forceinline__ int StageOf(const Params& p, int st) {
  return st < p.qkv_steps ? st % p.stages : (st - p.qkv_steps) % p.o_ring;
}
__device__ __forceinline__ int UsesBefore(const Params& p, int st) {
  if (st < p.qkv_steps) return st / p.stages;
  const int b = st - p.qkv_steps, s = b % p.o_ring;
  return max(0, (p.qkv_steps - s + p.stages - 1) / p.stages) + b / p.o_ring;
}

// *p += v, four floats at a 16-byte-aligned address, as one L2 reduction (sm_90).
__device__ __forceinline__ void RedAddV4(float* p, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

__device__ __forceinline__ void ConsumerSync() { asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory"); }
constexpr int kNewKvBarrier = 2;  // the new K/V's encoding warp and the writer (64 threads)

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

// Column of the q/k/v projection (= row of W_qkv) at column c of group g's slice: its query heads,
// then its K head, then its V head.
__device__ __forceinline__ int QkvColumn(const Params& p, int g, int c) {
  const int hd = p.g.head_dim, q_cols = p.group * hd;
  if (c < q_cols) return g * q_cols + c;
  if (c < q_cols + hd) return p.heads * hd + g * hd + (c - q_cols);
  return (p.heads + p.kvh) * hd + g * hd + (c - q_cols - hd);
}

// acc[i] += W tile i (16 rows of W at tile_base[i], 64 k, 128-byte swizzled) · Xᵀ (the 16 rows
// at x_base, likewise) for the tiles `has` marks: acc[i][j][e] is W row qg + 8 · (e / 2) of the
// tile against X row 8j + 2qc + e % 2, as StreamGemm's consumer lays them out.
__device__ __forceinline__ void MmaBox(uint32_t x_base, const uint32_t (&tile_base)[2], const bool (&has)[2],
                                       float (&acc)[2][2][4]) {
  // ldmatrix rows this lane addresses: of a W tile (rows 8 at a time, then the k half), of X (rows
  // 0-7 for the first k half and then the second, then rows 8-15).
  const int lane = threadIdx.x & 31;
  const int w_row = (lane & 7) + 8 * ((lane >> 3) & 1), w_half = lane >> 4;
  const int x_row = (lane & 7) + 8 * (lane >> 4), x_half = (lane >> 3) & 1;
#pragma unroll
  for (int ks = 0; ks < tma::kBoxK / 16; ++ks) {
    uint32_t bx[4];
    tma::LdMatrix4(x_base + Swizzled(x_row, 2 * ks + x_half), bx);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!has[i]) continue;
      uint32_t a[4];
      tma::LdMatrix4(tile_base[i] + Swizzled(w_row, 2 * ks + w_half), a);
      Mma(acc[i][0], a, bx[0], bx[1]);
      Mma(acc[i][1], a, bx[2], bx[3]);
    }
  }
}

template <KvDtype D, int HD>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionBlockKernel(const __grid_constant__ CUtensorMap wqkv_map, const __grid_constant__ CUtensorMap wqkv_wide_map,
                         const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap wo_map,
                         const __grid_constant__ Params p) {
  constexpr int kChunks = HD / 16;
  constexpr int kOTiles = HD / 16;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_s[kMaxStages], empty_s[kMaxStages];
  __shared__ __align__(8) uint64_t keys_done_s;  // late_o: the key buffers and stages are o's now
  __shared__ __align__(8) uint64_t keys_issued_s;  // o_waits: every consumer warp has issued its key tiles
  __shared__ alignas(16) float fresh_s[2][HD];
  __shared__ alignas(16) uint8_t new_row_s[2][HD];  // the new K and V, encoded (by the warp after the writer), and
  __shared__ float new_scale_s[2];                   // their scales
  __shared__ alignas(16) float scale_s[kWarps][kMaxKeyStages][32];  // each key stage's scales, copied with it
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  Stage<HD>(*const stages)[2] = reinterpret_cast<Stage<HD>(*)[2]>(ring + kStages * kStageBytes);
  float* q_s = reinterpret_cast<float*>(ring + kStages * kStageBytes + kWarps * 2 * sizeof(Stage<HD>));
  unsigned char* aux = reinterpret_cast<unsigned char*>(q_s + 8 * HD);  // 1024-aligned: the sizes above are
  static_assert((kWarps * 2 * sizeof(Stage<HD>) + 8 * HD * 4) % 1024 == 0, "aux is a swizzle base");

  const int ci = blockIdx.x, g = blockIdx.y;  // the CTA within its group, the group (KV head)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tile_first = ci * p.qkv_tiles / p.ctas, tile_count = (ci + 1) * p.qkv_tiles / p.ctas - tile_first;
  const int o_rows = 16 * p.o_tiles;
  const int total_stages = p.qkv_steps + p.o_boxes;
  const bool given = p.qkv_steps == 0;  // q/k/v in p.parts: the attention and o only
  if (threadIdx.x == 0) {
    if (!given) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&wqkv_map)) : "memory");
      if (p.wide) asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&wqkv_wide_map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&x_map)) : "memory");
    }
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&wo_map)) : "memory");
    for (int s = 0; s < kMaxStages; ++s) tma::BarrierInit(&full_s[s], 1), tma::BarrierInit(&empty_s[s], kWarps);
    tma::BarrierInit(&keys_done_s, 1);
    tma::BarrierInit(&keys_issued_s, kWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    Stamp(p, 0);
    if (p.timeline != nullptr) {  // not a time: the SM, + 1 (0 reads as no stamp)
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      Record(p, kAttentionBlockSmSlot, sm + 1);
    }
  }
  __syncthreads();

  if (warp == kWarps) {
    // The producer: q/k/v's stages (W, then xn once the previous kernel is done), then o's W,
    // which needs nothing but a free slot, so it streams while the consumers attend.
    if (lane == 0) {
      uint64_t stream_policy, keep_policy;  // W is read once; xn by every CTA
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(stream_policy));
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep_policy));
      auto load_x = [&](int step) {
        const int s = step % p.stages;
#pragma unroll
        for (int b = 0; b < kQkvBoxes; ++b) {
          tma::TmaLoad(ring + s * kStageBytes + kQkvWBytes + b * kBoxBytes, &x_map, (step * kQkvBoxes + b) * tma::kBoxK,
                       0, &full_s[s], keep_policy);
        }
      };
      // Launched programmatically, the first stages' W goes out before the wait (W is constant).
      const int early = p.overlap ? min(p.stages, p.qkv_steps) : 0;
      // The CTA's W tiles as one box a k box: all kMaxQkvTiles of them, contiguous rows of W_qkv
      // (the box then lands exactly as the tiles' boxes would, one after another).
      const int first_row = QkvColumn(p, g, 16 * tile_first);
      const bool one_box = p.wide && tile_count == kMaxQkvTiles &&
                           QkvColumn(p, g, 16 * (tile_first + tile_count - 1)) == first_row + 16 * (tile_count - 1);
      for (int st = 0; st < total_stages; ++st) {
        if (st == early && !given) {  // W_o alone needs nothing of the previous kernel
          GridDependencyWait();
          for (int e = 0; e < early; ++e) load_x(e);
        }
        if (p.o_waits && st == p.qkv_steps) tma::BarrierWait(&keys_issued_s, 0);
        const int s = StageOf(p, st), uses = UsesBefore(p, st);
        const bool late_first = p.late_o && uses == 0 && s >= min(p.stages, kStages);
        if (uses > 0) tma::BarrierWait(&empty_s[s], (uses - 1) & 1);
        // A late stage's first use: the consumers' key tiles and merge are done with its bytes.
        if (late_first) tma::BarrierWait(&keys_done_s, 0);
        unsigned char* stage = ring + s * kStageBytes;
        if (st < p.qkv_steps) {
          tma::BarrierExpect(&full_s[s], kQkvBoxes * (tile_count + 1) * kBoxBytes);
          for (int b = 0; b < kQkvBoxes; ++b) {
            const int k0 = (st * kQkvBoxes + b) * tma::kBoxK;
            if (one_box) {
              tma::TmaLoad(stage + b * kMaxQkvTiles * kBoxBytes, &wqkv_wide_map, k0, first_row, &full_s[s],
                           stream_policy);
              continue;
            }
            for (int t = 0; t < tile_count; ++t) {
              tma::TmaLoad(stage + (b * kMaxQkvTiles + t) * kBoxBytes, &wqkv_map, k0,
                           QkvColumn(p, g, 16 * (tile_first + t)), &full_s[s], stream_policy);
            }
          }
          if (st >= early) load_x(st);
        } else {
          const int b = st - p.qkv_steps;
          tma::BarrierExpect(&full_s[s], o_rows * 128);
          tma::TmaLoad(stage, &wo_map, g * p.group * HD + b * tma::kBoxK, ci * o_rows, &full_s[s], stream_policy);
        }
      }
    }
    __syncwarp();
  } else {
    const int tid = threadIdx.x;  // 0 .. kWarps · 32 - 1
    const int qg = lane >> 2, qc = lane & 3;
    const uint32_t ring_addr = tma::Smem(ring), aux_addr = tma::Smem(aux);

    // The row this CTA attends for, if any, and its first two key tiles a warp, copied now so
    // that they arrive while the projection streams. The new position's slot is stale in them
    // until the writer below overwrites it.
    const bool attends = ci < p.rows;
    const int r0 = ci;
    const int pos0 = attends ? p.meta.pos[r0] : 0;
    const int begin = p.sliding_window > 0 ? max(0, pos0 - p.sliding_window + 1) : 0, end = pos0 + 1;
    const int kvh = p.kvh, group = p.group;
    const int32_t* blocks = attends ? BlockTableRow(p.meta, p.g, r0) : nullptr;
    // The warp's key stage s: two in the key buffers, then (key_stages > 2, q/k/v given) the ring
    // stages o leaves unused, then the aux buffer.
    auto key_stage = [&](int s) -> Stage<HD>& {
      if (s < 2) return stages[warp][s];
      const int i = warp * (p.key_stages - 2) + s - 2;
      unsigned char* at = i < p.ring_key_stages ? ring + p.stages * kStageBytes + i * sizeof(Stage<HD>)
                                                : aux + (i - p.ring_key_stages) * sizeof(Stage<HD>);
      return *reinterpret_cast<Stage<HD>*>(at);
    };
    // Copies the tile at key t into key stage s, its scales into scale_s[warp][s]: one commit group,
    // an empty one past the row's end, so that when the loop waits for a tile, key_stages - 1 groups
    // were committed after its own. slot: the lane's TileSlot, if already looked up (else -1).
    const int t_first = begin + warp * kKeys;
    // With the row's tiles 8n + r (0 < r, n >= 2), warps 0 .. r - 1 hold n + 1 tiles and the last
    // of them (the writer's: the row's last tile) would be asked late, when o's W floods the DRAM
    // (4 µs in flight on the slowest CTAs against 1.3). Those warps copy their last tile first,
    // into an aux stage of their own (aux is idle until o with q/k/v given and two key stages);
    // the loop's refill that would have copied it commits an empty group. With the new K/V encoded
    // off the writer: keys computed max 18.7 → 14.6 µs on the H100 (docs/cuda-decode.md).
    const int row_tiles = attends ? (end - begin + kKeys - 1) / kKeys : 0;
    const bool last_early = given && p.key_stages == 2 && row_tiles / kWarps >= 2 &&
                            row_tiles % kWarps > warp &&
                            row_tiles % kWarps <= min(kWarps - 1, kAuxBytes / static_cast<int>(sizeof(Stage<HD>)));
    const int t_last = last_early ? t_first + row_tiles / kWarps * kWarps * kKeys : -1;  // its key
    Stage<HD>& last_stage = *reinterpret_cast<Stage<HD>*>(aux + warp * sizeof(Stage<HD>));
    constexpr int kLastScales = 2;  // scale_s[warp][2] holds the early last tile's scales
    static_assert(kMaxKeyStages > kLastScales, "a scale slot two key stages leave free");
    // o_waits: lane 0 arrives once, at the warp's last ask (at once if it has none): its last tile,
    // or with last_early the one before it.
    if (p.o_waits && lane == 0 && (!attends || t_first >= end)) tma::BarrierArrive(&keys_issued_s);
    auto issue = [&](int t, int s, int64_t slot = -1) {
      if (t == t_last) {  // copied first: an empty group, and its stamps stay the copy's
        __pipeline_commit();
        return;
      }
      TileStamp(p, t, t_first, 0);
      if (t < end) {
        mma_attention::IssueTileAt<HD, true>(key_stage(s), slot >= 0 ? slot : mma_attention::TileSlot(blocks, p.g, t, end),
                                             p.g, p.layer, g, scale_s[warp][s]);
        const bool last_ask = last_early ? t + kWarps * kKeys == t_last : t + kWarps * kKeys >= end;
        if (p.o_waits && lane == 0 && last_ask) tma::BarrierArrive(&keys_issued_s);
      } else {
        __pipeline_commit();  // past the row: an empty group
      }
      TileStamp(p, t, t_first, 1);
    };
    int t0 = t_first;
    // issued: the warp's first key_stages tiles started (tile i in stage i); those not started here
    // start after q/k/v.
    int issued = 0;
    auto issue_first = [&](int upto) {
      if (!attends) return;
      if (last_early && issued == 0 && upto > 0) {  // its own group, before tile 0's: the loop's waits still hold
        TileStamp(p, t_last, t_first, 0);
        mma_attention::IssueTileAt<HD, true>(last_stage, mma_attention::TileSlot(blocks, p.g, t_last, end), p.g,
                                             p.layer, g, scale_s[warp][kLastScales]);
        TileStamp(p, t_last, t_first, 1);
      }
      for (; issued < min(upto, p.key_stages); ++issued) issue(t0 + issued * kWarps * kKeys, issued);
    };
    issue_first(p.early_tiles);
    if (p.late_o && !attends && tid == 0) tma::BarrierArrive(&keys_done_s);  // no keys: o's from the start
    GridDependencyWait();  // x, the cache and the scratch buffers are the previous kernels' before

    // q/k/v: warp w takes k box w % 4 of each stage and tiles w / 4, w / 4 + 2 of the CTA's.
    if (!given) {
      const int kb = warp & 3, half = warp >> 2;
      float acc[2][2][4] = {};
      for (int st = 0; st < p.qkv_steps; ++st) {
        const int s = st % p.stages;
        tma::BarrierWait(&full_s[s], (st / p.stages) & 1);
        const uint32_t w_base = ring_addr + s * kStageBytes + kb * kMaxQkvTiles * kBoxBytes;
        const uint32_t x_base = ring_addr + s * kStageBytes + kQkvWBytes + kb * kBoxBytes;
        MmaBox(x_base, {w_base + half * kBoxBytes, w_base + (half + 2) * kBoxBytes},
               {half < tile_count, half + 2 < tile_count}, acc);
        __syncwarp();
        if (lane == 0) tma::BarrierArrive(&empty_s[s]);
      }
      // acc[i][j][e]: column 16 · tile + qg + 8 · (e / 2) of row 8j + 2qc + e % 2. The four k boxes'
      // sums meet in aux: [k box][16 rows][64 columns].
      float* sums = reinterpret_cast<float*>(aux);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (half + 2 * i >= tile_count) continue;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 16 * (half + 2 * i) + qg + 8 * (e >> 1), row = 8 * j + 2 * qc + (e & 1);
            sums[(kb * 16 + row) * 64 + col] = acc[i][j][e];
          }
        }
      }
      ConsumerSync();
      for (int i = tid; i < kMaxRows * 16 * tile_count; i += kWarps * 32) {
        const int row = i / (16 * tile_count), col = i % (16 * tile_count);
        if (row >= p.rows) continue;
        float v = 0.0f;
#pragma unroll
        for (int b = 0; b < kQkvBoxes; ++b) v += sums[(b * 16 + row) * 64 + col];
        p.qkv[static_cast<int64_t>(row) * p.qkvw + QkvColumn(p, g, 16 * tile_first + col)] = v;
      }
      ConsumerSync();
      if (tid == 0) {
        __threadfence();
        atomicAdd(p.counters + g, 1);
        Stamp(p, 1);
      }
    }
    issue_first(p.key_stages);

    if (attends) {
      // The group's q/k/v are complete once its S CTAs have counted themselves (given: at the wait).
      if (tid == 0) {
        while (!given && tma::LoadAcquire(p.counters + g) < p.ctas) __nanosleep(20);
        Stamp(p, 2);
      }
      ConsumerSync();
      AttentionRope rope{.inv_freq = p.inv_freq, .parts = given ? p.parts : Partials{}, .bias = p.bias};
      // Two rotation pairs a thread (384 at the 8B shape over 256 threads), loaded together.
      mma_attention::RopeIntoShared<HD, 2>(given ? nullptr : p.qkv + static_cast<int64_t>(r0) * p.qkvw, rope,
                                           static_cast<int64_t>(r0) * p.qkvw, static_cast<float>(pos0), p.heads,
                                           kvh, group, g, q_s, &fresh_s[0][0], kWarps * 32);
      ConsumerSync();
      if (tid == 0) Stamp(p, 7);
      // Q fragments (scaled into the exp2 domain): row qg is query head qg of the group, its dims as
      // DecodeQkScores takes K's (chunk kc: dims HD/4·qc + 4kc .. + 3).
      uint32_t qa[kChunks][2];
      {
        const float qs = p.scale * kLog2e;
        const float* qrow = q_s + (qg % group) * HD;
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
      // The warp after the writer encodes the new K and V (and writes them to the cache) now and
      // hands them over through new_row_s / new_scale_s and a named barrier. The writer holds the
      // row's last tile, so it has as many tiles as any warp, and encoding at its tile (WriteNewKv)
      // cost it ~1 µs; the warp after it has one tile fewer unless the row's tiles are a multiple
      // of kWarps.
      if (warp == (writer_warp + 1) % kWarps) {
        float scales[2];
        int clamped = 0;
        mma_attention::EncodeNewKv<D, HD>(fresh_s, new_row_s[0], new_row_s[1], CacheSlot(blocks, p.g.block_size, pos0),
                                          g, p.g, p.layer, scales, &clamped);
        if (clamped) atomicAdd(p.clamps, static_cast<unsigned long long>(clamped));
        if (lane == 0) new_scale_s[0] = scales[0], new_scale_s[1] = scales[1];
        asm volatile("bar.arrive %0, %1;" ::"n"(kNewKvBarrier), "n"(64) : "memory");  // release: the row is written
      }
      float o[kOTiles][4];
#pragma unroll
      for (int t = 0; t < kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
      float m = -INFINITY, l = 0.0f, o_scale = 1.0f;
      for (int s = 0; t0 < end; s = s + 1 == p.key_stages ? 0 : s + 1, t0 += kWarps * kKeys) {
        // This tile's group and every older one have landed.
        if (p.key_stages == 2) {
          __pipeline_wait_prior(1);
        } else if (p.key_stages == 3) {
          __pipeline_wait_prior(2);
        } else {
          __pipeline_wait_prior(3);
        }
        __syncwarp();
        TileStamp(p, t0, t_first, 2);
        const long long landed_clock = p.timeline != nullptr ? clock64() : 0;
        // The block-table lookup of the tile this one's stage takes next, now, so that its round
        // trip passes under this tile's compute instead of delaying the copy.
        const int t_refill = t0 + p.key_stages * kWarps * kKeys;
        int64_t refill_slot = -1;
        if (t_refill < end && t_refill != t_last) {
          refill_slot = mma_attention::TileSlot(blocks, p.g, t_refill, end);
        }
        Stage<HD>& stage = t0 == t_last ? last_stage : key_stage(s);
        float scale_cur = scale_s[warp][t0 == t_last ? kLastScales : s][lane];
        if (writer && t0 <= pos0 && pos0 < t0 + kKeys) {  // the tile's copy of the new key is stale
          asm volatile("bar.sync %0, %1;" ::"n"(kNewKvBarrier), "n"(64) : "memory");  // the encoder's row
          constexpr int kRow = mma_attention::RowBytes<HD>(), kWords = HD / 4;
          for (int i = lane; i < 2 * kWords; i += 32) {
            const int which = i / kWords, w = i % kWords;
            *reinterpret_cast<uint32_t*>((which ? stage.v : stage.k) + (pos0 - t0) * kRow + 4 * w) =
                *reinterpret_cast<const uint32_t*>(&new_row_s[which][4 * w]);
          }
          const float new_scale[2] = {new_scale_s[0], new_scale_s[1]};
          mma_attention::MaskPastNewKey<HD>(stage, pos0 - t0, new_scale, &scale_cur);
          __syncwarp();
        }
        const uint8_t* ks = stage.k;
        const uint8_t* vs = stage.v;
        // S = Q · Kᵀ (keys 8j + 2qc, +1 of row qg in sc[j][0..1]), then the online softmax with
        // the V scales folded into P, then Oᵀ += Vᵀ · Pᵀ: attention_mma.cuh's decode path.
        float sc[2][4];
        DecodeQkScores<D, HD>(ks, qa, sc);
        float pr[2][2], vsc[2][2], tmax = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = 8 * j + 2 * qc + e, at = t0 + key;
            const float kscale = __shfl_sync(0xffffffffu, scale_cur, key);
            vsc[j][e] = __shfl_sync(0xffffffffu, scale_cur, 16 + key);
            pr[j][e] = at < end ? sc[j][e] * kscale : -INFINITY;
            tmax = fmaxf(tmax, pr[j][e]);
          }
        }
        float vmax = fmaxf(fmaxf(vsc[0][0], vsc[0][1]), fmaxf(vsc[1][0], vsc[1][1]));
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
          tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o2));
          vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o2));
        }
        uint32_t pa[4] = {0u, 0u, 0u, 0u};
        const float inv_vmax = 1.0f / vmax;
        const float m_new = fmaxf(m, tmax), m_ref = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2f(m - m_ref);
        float psum = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float e0 = exp2f(pr[j][0] - m_ref), e1 = exp2f(pr[j][1] - m_ref);
          psum += e0 + e1;
          pa[2 * j] = PackHalf2(e0 * vsc[j][0] * inv_vmax, e1 * vsc[j][1] * inv_vmax);
        }
        l = l * corr + psum;
        m = m_new;
        const float f = corr * o_scale * inv_vmax;
        o_scale = vmax;
        mma_attention::DecodePv<D, HD>(vs, pa, f, o);
        TileStamp(p, t0, t_first, 3);
        if (p.timeline != nullptr) TileStamp(p, t0, t_first, 4, clock64() - landed_clock);
        __syncwarp();  // every lane is done with this stage: its next tile
        issue(t_refill, s, refill_slot);
      }
      __pipeline_wait_prior(0);
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      // Merge the warps' partial softmaxes through the stage buffers, write the group's heads.
      float* o_s = reinterpret_cast<float*>(&stages[0][0]);
      float* ml_s = o_s + kWarps * 16 * HD;
      static_assert(sizeof(Stage<HD>) * kWarps * 2 >= (kWarps * 16 * HD + kWarps * 32) * sizeof(float), "merge buffer");
      ConsumerSync();
      if (tid == 0) Stamp(p, 8);
      if (qc == 0) ml_s[(warp * 16 + qg) * 2] = m, ml_s[(warp * 16 + qg) * 2 + 1] = l;
      mma_attention::StoreDecodeO<HD>(o_s, warp, o, o_scale);
      ConsumerSync();
      __half* out = p.attn + (static_cast<int64_t>(r0) * p.heads + g * group) * HD;
      for (int i = tid; i < group * HD; i += kWarps * 32) {
        const int r = i / HD, d = i % HD;
        const mma_attention::WarpMerge w = mma_attention::MergeWarps<kWarps>(
            o_s, ml_s, r, [&](int w2) { return DecodeMergeAt<HD>(w2 * kDecodeMergeRows + r, d); });
        out[i] = __float2half(w.acc / w.sum);
      }
      // late_o: TMA (the async proxy) writes W_o over what these threads wrote there.
      if (p.late_o) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      ConsumerSync();
      if (p.late_o && tid == 0) tma::BarrierArrive(&keys_done_s);
      if (tid == 0) {
        Stamp(p, 9);
        __threadfence();
        atomicAdd(p.counters + kvh + g, 1);
        Stamp(p, 3);
      }
    }

    // o: the group's rows of attention (all its rows attended) times the CTA's W_o rows over the
    // group's columns, added into x. Warp w takes tiles w, w + 8 of the CTA's.
    TriggerDependents();  // the next kernel waits for this whole grid before it reads x
    if (tid == 0) {
      while (tma::LoadAcquire(p.counters + p.kvh + g) < p.rows) __nanosleep(20);
      Stamp(p, 4);
    }
    ConsumerSync();
    {
      // A thread's loads all go out before its stores: in one loop each store (to a generic
      // address, which may alias the next load) held the next load back, a round trip each.
      const int group_dims = p.group * HD, chunks = group_dims / 8;  // 16-byte chunks a row
      constexpr int kPerThread = kMaxRows * (kMaxGroupDims / 8) / (kWarps * 32);
      static_assert(kMaxRows * (kMaxGroupDims / 8) % (kWarps * 32) == 0, "whole chunks a thread");
      uint4 v[kPerThread];
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int i = tid + j * kWarps * 32, row = i / chunks, c = i % chunks;
        v[j] = make_uint4(0u, 0u, 0u, 0u);
        if (i < kMaxRows * chunks && row < p.rows) {
          v[j] = *reinterpret_cast<const uint4*>(p.attn + static_cast<int64_t>(row) * p.qd + g * group_dims + 8 * c);
        }
      }
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int i = tid + j * kWarps * 32, row = i / chunks, c = i % chunks;
        if (i < kMaxRows * chunks) *reinterpret_cast<uint4*>(aux + (c / 8) * kBoxBytes + Swizzled(row, c % 8)) = v[j];
      }
    }
    ConsumerSync();
    float acc[2][2][4] = {};
    for (int b = 0; b < p.o_boxes; ++b) {
      const int st = p.qkv_steps + b, s = StageOf(p, st);
      tma::BarrierWait(&full_s[s], UsesBefore(p, st) & 1);
      const uint32_t w_base = ring_addr + s * kStageBytes, x_base = aux_addr + b * kBoxBytes;
      MmaBox(x_base, {w_base + warp * kBoxBytes, w_base + (warp + kWarps) * kBoxBytes},
             {warp < p.o_tiles, warp + kWarps < p.o_tiles}, acc);
      __syncwarp();
      if (lane == 0) tma::BarrierArrive(&empty_s[s]);
    }
    if (tid == 0) Stamp(p, 5);
    if (p.vector_adds) {
      if (p.late_o) ConsumerSync();  // late stages share the transpose's bytes: every warp done reading
      // Through 2.5 KB a warp of the key buffers (idle after the attention), so that each lane adds
      // four adjacent columns of one row with one vector reduction: 4× fewer L2 reductions. Rows
      // kOStride floats apart: the quad's four lanes store into different banks.
      constexpr int kOStride = 20, kOTile = 16 * kOStride;
      float* t_s = reinterpret_cast<float*>(&stages[0][0]) + warp * 2 * kOTile;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            t_s[i * kOTile + (8 * j + 2 * qc + (e & 1)) * kOStride + qg + 8 * (e >> 1)] = acc[i][j][e];
          }
        }
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int t = warp + kWarps * i;
        if (t >= p.o_tiles) continue;
#pragma unroll
        for (int q = lane; q < 64; q += 32) {
          const int row = q >> 2, c = 4 * (q & 3);
          if (row >= p.rows) continue;
          const float4 v = *reinterpret_cast<const float4*>(t_s + i * kOTile + row * kOStride + c);
          RedAddV4(p.x + static_cast<int64_t>(row) * p.hidden + ci * o_rows + 16 * t + c, v);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int t = warp + kWarps * i;
        if (t >= p.o_tiles) continue;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = ci * o_rows + 16 * t + qg + 8 * (e >> 1), row = 8 * j + 2 * qc + (e & 1);
            if (row < p.rows) atomicAdd(p.x + static_cast<int64_t>(row) * p.hidden + col, acc[i][j][e]);
          }
        }
      }
    }
  }
  // The last CTA out leaves the counters zeroed for the next launch: every CTA has passed every
  // wait before it counts itself finished.
  __syncthreads();
  if (threadIdx.x == 0) {
    Stamp(p, 6);
    __threadfence();
    const int total = static_cast<int>(gridDim.x * gridDim.y);
    if (atomicAdd(p.counters + 2 * p.kvh, 1) == total - 1) {
      __threadfence();
      for (int i = 0; i <= 2 * p.kvh; ++i) p.counters[i] = 0;
      __threadfence();
    }
  }
}

// Calls f(dtype tag, head_dim tag) for the geometry's instance (FP8, head_dim 32/64/128).
template <typename F>
auto WithInstance(const KvGeometry& g, F&& f) {
  auto by_dim = [&](auto dtype_tag) {
    if (g.head_dim == 32) return f(dtype_tag, std::integral_constant<int, 32>{});
    if (g.head_dim == 64) return f(dtype_tag, std::integral_constant<int, 64>{});
    return f(dtype_tag, std::integral_constant<int, 128>{});
  };
  if (g.dtype == KvDtype::kFp8E5M2) return by_dim(std::integral_constant<KvDtype, KvDtype::kFp8E5M2>{});
  return by_dim(std::integral_constant<KvDtype, KvDtype::kFp8E4M3>{});
}

// S: the CTAs of a group, as many as fit (16 at most) with the whole grid resident at once.
int GroupCtas(int sms, int kv_heads) { return std::min(kMaxGroupCtas, kv_heads > 0 ? sms / kv_heads : 0); }

}  // namespace

int AttentionBlockMaxKeyStages(int head_dim, int ring_stages) {
  if (head_dim == 128) return MaxKeyStages<128>(ring_stages);
  return head_dim == 64 ? MaxKeyStages<64>(ring_stages) : MaxKeyStages<32>(ring_stages);
}

int AttentionBlockMaxRingStages(int head_dim, int early_key_tiles) {
  if (early_key_tiles != 0) return kStages;
  if (head_dim == 128) return kStages + KeyBufferStages<128>();
  return kStages + (head_dim == 64 ? KeyBufferStages<64>() : KeyBufferStages<32>());
}

absl::Status AttentionBlockTakes(int rows, int hidden, int heads, const KvGeometry& g, int sliding_window) {
  absl::StatusOr<int> sms = CurrentDeviceSmCount();
  if (!sms.ok()) return sms.status();
  const int kvh = g.kv_heads, hd = g.head_dim;
  const int ctas = GroupCtas(*sms, kvh);
  if (g.dtype == KvDtype::kFp16 || (hd != 32 && hd != 64 && hd != 128)) {
    return absl::InvalidArgumentError("AttentionBlock: an FP8 cache with head_dim 32, 64 or 128");
  }
  if (kvh <= 0 || heads % kvh != 0 || heads / kvh > 8 || sliding_window < 0) {
    return absl::InvalidArgumentError("AttentionBlock: 1-8 query heads a KV head");
  }
  if ((2 * static_cast<size_t>(kvh) + 1) * sizeof(int) > kAttentionBlockWorkspaceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: ", kvh, " KV heads outgrow the counters"));
  }
  const int group = heads / kvh, qkv_tiles = (group + 2) * hd / 16;
  if (rows < 1 || rows > std::min(kMaxRows, ctas)) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: 1..", std::min(kMaxRows, ctas), " rows"));
  }
  if (hidden % (tma::kBoxK * kQkvBoxes) != 0 || (qkv_tiles + ctas - 1) / ctas > kMaxQkvTiles ||
      group * hd % tma::kBoxK != 0 || group * hd > kMaxGroupDims || hidden % (16 * ctas) != 0 ||
      hidden / (16 * ctas) > kMaxOTiles) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: a shape it does not tile (hidden ", hidden,
                                                   ", group ", group, ", head_dim ", hd, ", ", ctas, " CTAs a group)"));
  }
  return absl::OkStatus();
}

absl::Status AttentionBlock(const AttentionBlockArgs& a, cudaStream_t stream) {
  if (absl::Status s = AttentionBlockTakes(a.rows, a.hidden, a.heads, a.geometry, a.sliding_window); !s.ok()) return s;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const Partials parts = a.qkv_parts.OrNone();
  const bool given = parts.count > 0;
  if (given) {
    const int64_t width = int64_t{a.rows} * (a.heads + 2 * a.geometry.kv_heads) * a.geometry.head_dim;
    if (parts.count > kMaxPartials || parts.stride < width) {
      return absl::InvalidArgumentError(
          absl::StrCat("AttentionBlock: q/k/v given as 1..", kMaxPartials, " partials of [rows, q/k/v width] each"));
    }
  } else if (a.xn == nullptr || a.w_qkv == nullptr || !aligned(a.xn) || !aligned(a.w_qkv) || a.qkv == nullptr) {
    return absl::InvalidArgumentError("AttentionBlock: xn and w_qkv 16-byte aligned and a qkv scratch, or q/k/v given");
  }
  if (a.w_o == nullptr || !aligned(a.w_o) || !aligned(a.attn) || a.attn == nullptr || a.x == nullptr || !aligned(a.x) ||
      a.inv_freq == nullptr || a.clamps == nullptr || a.workspace == nullptr || a.meta.pos == nullptr ||
      a.meta.seq == nullptr || a.meta.block_table == nullptr) {
    return absl::InvalidArgumentError(
        "AttentionBlock: w_o, attn and x 16-byte aligned; inv_freq, clamps, the row metadata and a workspace");
  }
  const int max_stages = AttentionBlockMaxRingStages(a.geometry.head_dim, a.early_key_tiles);
  if (a.ring_stages < 2 || a.ring_stages > max_stages || a.early_key_tiles < 0 || a.early_key_tiles > 2) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: 0..2 early key tiles, 2..", max_stages,
                                                   " ring stages with ", a.early_key_tiles));
  }
  const int max_keys = given ? AttentionBlockMaxKeyStages(a.geometry.head_dim, a.ring_stages) : 2;
  if (a.key_stages < 2 || a.key_stages > max_keys) {
    return absl::InvalidArgumentError(absl::StrCat("AttentionBlock: 2..", max_keys, " key stages with ",
                                                   a.ring_stages, " ring stages", given ? "" : " (more need q/k/v given)"));
  }
  absl::StatusOr<int> sms = CurrentDeviceSmCount();
  if (!sms.ok()) return sms.status();
  const KvGeometry& g = a.geometry;
  Params p{};
  p.rows = a.rows, p.hidden = a.hidden, p.heads = a.heads, p.kvh = g.kv_heads, p.group = a.heads / g.kv_heads;
  p.qd = a.heads * g.head_dim, p.qkvw = (a.heads + 2 * g.kv_heads) * g.head_dim;
  p.ctas = GroupCtas(*sms, g.kv_heads);
  p.qkv_tiles = (p.group + 2) * g.head_dim / 16;
  p.o_tiles = a.hidden / (16 * p.ctas);
  p.qkv_steps = given ? 0 : a.hidden / (tma::kBoxK * kQkvBoxes);
  p.parts = parts;
  p.o_boxes = p.group * g.head_dim / tma::kBoxK;
  p.sliding_window = a.sliding_window, p.scale = a.scale, p.bias = a.bias, p.inv_freq = a.inv_freq;
  p.meta = a.meta, p.g = g, p.layer = a.layer;
  p.qkv = a.qkv, p.attn = a.attn, p.x = a.x, p.clamps = a.clamps, p.counters = static_cast<int*>(a.workspace);
  p.overlap = a.overlap_previous, p.timeline = a.timeline;
  p.stages = a.ring_stages, p.early_tiles = a.early_key_tiles, p.wide = a.wide_boxes, p.vector_adds = a.vector_adds;
  p.key_stages = a.key_stages;
  p.late_o = given && a.late_o_stages;
  p.o_waits = given && a.o_waits_for_keys;
  const int key_buffer_stages = g.head_dim == 128  ? KeyBufferStages<128>()
                                : g.head_dim == 64 ? KeyBufferStages<64>()
                                                   : KeyBufferStages<32>();
  p.o_ring = p.late_o ? kStages + key_buffer_stages : std::min(a.ring_stages, kStages);
  p.ring_key_stages = g.head_dim == 128  ? RingKeyStages<128>(a.ring_stages)
                      : g.head_dim == 64 ? RingKeyStages<64>(a.ring_stages)
                                         : RingKeyStages<32>(a.ring_stages);
  CUtensorMap maps[4] = {};  // given: q/k/v's three stay zero, never read
  if (!given) {
    if (absl::Status s = tma::Map(&maps[0], a.w_qkv, a.hidden, p.qkvw, 16); !s.ok()) return s;
    if (absl::Status s = tma::Map(&maps[1], a.w_qkv, a.hidden, p.qkvw, 16 * kMaxQkvTiles); !s.ok()) return s;
    if (absl::Status s = tma::Map(&maps[2], a.xn, a.hidden, a.rows, 16); !s.ok()) return s;
  }
  if (absl::Status s = tma::Map(&maps[3], a.w_o, p.qd, a.hidden, 16 * p.o_tiles); !s.ok()) return s;
  cudaError_t launched = cudaSuccess;
  WithInstance(g, [&](auto dtype_tag, auto hd_tag) {
    constexpr KvDtype D = decltype(dtype_tag)::value;
    constexpr int HD = decltype(hd_tag)::value;
    auto kernel = AttentionBlockKernel<D, HD>;
    constexpr int smem = SmemBytes<HD>();
    static PerDeviceInt opted;  // the instance's shared-memory attribute, once a device
    absl::Status set = opted
                           .Get([&]() -> absl::StatusOr<int> {
                             TAILSERVE_CUDA_RETURN_IF_ERROR(
                                 cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                             return 1;
                           })
                           .status();
    if (!set.ok()) {
      launched = cudaErrorInvalidConfiguration;
      return;
    }
    launched = LaunchMaybeOverlapped(a.overlap_previous, dim3(p.ctas, g.kv_heads), dim3(kThreads), smem, stream,
                                     kernel, maps[0], maps[1], maps[2], maps[3], p);
  });
  TAILSERVE_CUDA_RETURN_IF_ERROR(launched);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
