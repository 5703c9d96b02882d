#pragma once
// What the attention block's pieces share (attention_block.h says what the launch does): its
// launch shape, parameters, shared-memory layout and timeline stamps. Included by
// attention_block.cu and the pieces it includes (attention_block_attend.cuh, attention_block_o.cuh).
#include <cstdint>

#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/attention_mma_merge.cuh"
#include "worker/backends/cuda/kernels/attention_mma_new_kv.cuh"
#include "worker/backends/cuda/kernels/attention_mma_tiles.cuh"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/tma.cuh"

namespace tailserve::cuda::attention_block {

using mma_attention::Stage;

constexpr int kWarps = 8;                    // consumer warps: the attention, then o's MMAs
constexpr int kThreads = (kWarps + 1) * 32;  // + the producer warp, which streams W_o
static_assert(kWarps == kAttentionBlockStampedWarps, "the timeline has a warp's tiles for each consumer warp");
constexpr int kMaxRows = 16;       // an MMA's n: the rows ride in one m16n8k16 B fragment pair
constexpr int kMaxGroupCtas = 16;  // S, the CTAs of a KV-head group
constexpr int kBoxBytes = 16 * tma::kBoxK * 2;  // a 16-row box of 64 k: 2 KB
constexpr int kMaxOTiles = 16;                  // o's 16-row W tiles a CTA (≤ 256 rows: one TMA box)
// W_o's ring: a stage is one k box of the CTA's ≤ 256 W_o rows (32 KB); four leave room for the
// attention's key tiles and the merge.
constexpr int kStageBytes = kMaxOTiles * 16 * tma::kBoxK * 2;
constexpr int kStages = 4;
constexpr int kAuxBytes = 16 * 1024;  // o's 16 input rows (and, before o, the warps' early last key tiles)
constexpr int kMaxGroupDims = kAuxBytes / (kMaxRows * 2);  // G · head_dim: o's k a group, 512
// Key tiles in flight a warp: two, in the warp's two key buffers (more measured no faster).
constexpr int kKeyStages = 2;
constexpr int kLastScales = kKeyStages;  // scale_s[warp][2]: the early last tile's scales
constexpr int kNewKvBarrier = 2;         // named barrier: the new K/V's encoding warp and the writer (64 threads)
static_assert(kWarps * 2 * 16 * 20 * 4 <= kWarps * 2 * static_cast<int>(sizeof(Stage<32>)),
              "o's products of every warp (16 rows 20 floats apart, two tiles) fit the key buffers");

// Dynamic shared memory: 1024-byte alignment slack, W_o's ring, the key buffers ([warp][2]), the
// rotated q heads (8 · head_dim floats), aux.
template <int HD>
constexpr int SmemBytes() {
  return 1024 + kStages * kStageBytes + kWarps * 2 * static_cast<int>(sizeof(Stage<HD>)) + 8 * HD * 4 + kAuxBytes;
}
// Static shared memory: the ring's barriers and keys_issued_s, the fresh K/V and its encoded row
// and scales, the key tiles' scales (alignment included).
template <int HD>
constexpr int StaticSmemBytes() {
  return (2 * kStages + 1) * 8 + 2 * HD * 4 + 2 * HD + 2 * 4 + kWarps * (kKeyStages + 1) * 32 * 4;
}
static_assert(SmemBytes<128>() + StaticSmemBytes<128>() <= 227 * 1024, "one CTA an SM");

struct Params {
  int rows, hidden, heads, kvh, group, qkvw, qd, ctas;  // ctas: S
  int o_tiles;  // 16-row tiles of W_o a CTA
  int o_boxes;  // o's k boxes (ring steps): G · head_dim / 64
  int sliding_window;
  float scale;
  const float* bias;
  const float* inv_freq;
  Partials parts;  // the q/k/v projection's partials
  RowMeta meta;
  KvGeometry g;
  KvLayerView layer;
  __half* attn;
  float* x;
  unsigned long long* clamps;
  int* counters;  // [kvh]: rows attended a group; [kvh]: CTAs finished
  bool overlap;
  uint64_t* timeline;  // AttentionBlockArgs::timeline
};

// The kernel's shared memory, as the pieces see it.
template <int HD>
struct Shared {
  unsigned char* ring;       // kStages × kStageBytes, 1024-aligned (TMA swizzle)
  Stage<HD> (*stages)[2];    // [warp][2] key buffers; after the attention the merge, then o's transposes
  float* q_s;                // [8][HD]: the group's rotated q heads
  unsigned char* aux;        // 1024-aligned
  uint64_t* full_s;          // [kStages]
  uint64_t* empty_s;         // [kStages]
  uint64_t* keys_issued_s;   // every consumer warp has asked for its last key tile
  float (*fresh_s)[2][HD];   // the new position's K (rotated) and V, fp32
  uint8_t (*new_row_s)[HD];  // [2][HD]: the same, encoded (by the warp after the writer)
  float* new_scale_s;        // [2]: their scales
  float (*scale_s)[kKeyStages + 1][32];  // [warp][stage or kLastScales][lane]: each key tile's scales
};

// The CTA's timeline slot `which` (AttentionBlockArgs::timeline) = value; the caller checks for a timeline.
__device__ __forceinline__ void Record(const Params& p, int which, uint64_t value) {
  p.timeline[(blockIdx.y * gridDim.x + blockIdx.x) * kAttentionBlockStamps + which] = value;
}

__device__ __forceinline__ void Stamp(const Params& p, int which) {
  if (!Timed(p.timeline)) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  Record(p, which, t);
}

// Lane 0 stamps event e (AttentionBlockArgs::timeline) of the warp's key tile at key t, the
// warp's first at t_first: where a tile's time goes (block-table load, landing, compute).
// cycles ≥ 0: event e is that count, not a time.
__device__ __forceinline__ void TileStamp(const Params& p, int t, int t_first, int e, long long cycles = -1) {
  if (!Timed(p.timeline) || (threadIdx.x & 31) != 0) return;
  const int warp = threadIdx.x >> 5, tile = (t - t_first) / (kWarps * mma_attention::kKeys);
  if (tile >= kAttentionBlockStampedTiles) return;
  const int which = kAttentionBlockCtaStamps + (warp * kAttentionBlockStampedTiles + tile) * kAttentionBlockTileEvents + e;
  if (cycles >= 0) {
    Record(p, which, cycles);
  } else {
    Stamp(p, which);
  }
}

__device__ __forceinline__ void ConsumerSync() { asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory"); }

}  // namespace tailserve::cuda::attention_block
