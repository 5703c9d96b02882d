#pragma once
// The attention block's o projection: the producer warp streams the CTA's slice of W_o (its
// output columns over its group's input columns) into a ring once every consumer warp has asked
// for its key tiles; once the group's rows are attended, the consumer warps multiply them by the
// slice and add the products into x.
#include "worker/backends/cuda/kernels/attention_block_shared.cuh"

namespace tailserve::cuda::attention_block {

using tma::Swizzled;

// *p += v, four floats at a 16-byte-aligned address, as one L2 reduction (sm_90).
__device__ __forceinline__ void RedAddV4(float* p, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
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
      mma_attention::Mma(acc[i][0], a, bx[0], bx[1]);
      mma_attention::Mma(acc[i][1], a, bx[2], bx[3]);
    }
  }
}

// The producer warp: W_o's k boxes into the ring. W_o is constant, so it needs no wait for the
// previous kernel; it starts only once the consumer warps have asked for their last key tiles, so
// that a CTA asks the DRAM for its keys before the 128 KB of W_o its ring takes, not beside them
// (the 16-row kernel 55.3 → 52.5 µs, the first key tile 4.4 µs in flight instead of 11).
template <int HD>
__device__ __forceinline__ void ProduceWo(const Params& p, const Shared<HD>& sm, const CUtensorMap& wo_map, int ci,
                                          int g) {
  if ((threadIdx.x & 31) != 0) return;
  uint64_t stream_policy;  // W is read once
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(stream_policy));
  const int o_rows = 16 * p.o_tiles;
  tma::BarrierWait(sm.keys_issued_s, 0);
  for (int b = 0; b < p.o_boxes; ++b) {
    const int s = b % kStages, uses = b / kStages;
    if (uses > 0) tma::BarrierWait(&sm.empty_s[s], (uses - 1) & 1);
    tma::BarrierExpect(&sm.full_s[s], o_rows * 128);
    tma::TmaLoad(sm.ring + s * kStageBytes, &wo_map, g * p.group * HD + b * tma::kBoxK, ci * o_rows, &sm.full_s[s],
                 stream_policy);
  }
}

// The consumer warps' o: the group's rows of attention (once all are attended) times the CTA's
// W_o rows over the group's columns, added into x. Warp w takes tiles w, w + 8 of the CTA's.
template <int HD>
__device__ __forceinline__ void ProjectO(const Params& p, const Shared<HD>& sm, int ci, int g) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int qg = lane >> 2, qc = lane & 3;
  const int o_rows = 16 * p.o_tiles;
  TriggerDependents();  // the next kernel waits for this whole grid before it reads x
  if (tid == 0) {
    while (tma::LoadAcquire(p.counters + g) < p.rows) __nanosleep(20);
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
      if (i < kMaxRows * chunks) *reinterpret_cast<uint4*>(sm.aux + (c / 8) * kBoxBytes + Swizzled(row, c % 8)) = v[j];
    }
  }
  ConsumerSync();
  const uint32_t ring_addr = tma::Smem(sm.ring), aux_addr = tma::Smem(sm.aux);
  float acc[2][2][4] = {};
  for (int b = 0; b < p.o_boxes; ++b) {
    const int s = b % kStages;
    tma::BarrierWait(&sm.full_s[s], (b / kStages) & 1);
    const uint32_t w_base = ring_addr + s * kStageBytes, x_base = aux_addr + b * kBoxBytes;
    MmaBox(x_base, {w_base + warp * kBoxBytes, w_base + (warp + kWarps) * kBoxBytes},
           {warp < p.o_tiles, warp + kWarps < p.o_tiles}, acc);
    __syncwarp();
    if (lane == 0) tma::BarrierArrive(&sm.empty_s[s]);
  }
  if (tid == 0) Stamp(p, 5);
  // Through 2.5 KB a warp of the key buffers (idle after the attention), so that each lane adds
  // four adjacent columns of one row with one vector reduction: 4× fewer L2 reductions than an
  // atomic add a float. Rows kOStride floats apart: the quad's four lanes store into different banks.
  constexpr int kOStride = 20, kOTile = 16 * kOStride;
  float* t_s = reinterpret_cast<float*>(&sm.stages[0][0]) + warp * 2 * kOTile;
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
}

}  // namespace tailserve::cuda::attention_block
