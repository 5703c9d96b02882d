#include "worker/backends/cuda/kernels/rope_kv.h"

#include <algorithm>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/kv_codec.cuh"
#include "worker/backends/cuda/kernels/qkv_layout.h"

namespace tailserve::cuda {
namespace {

constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256
constexpr int kHeadsPerBlock = 4;

// Grid (rows, heads / 4): a warp per head (the range's q heads, then its k heads, then its v
// heads), each lane the rotation pairs lane, lane + 32, ... One head a warp and blocks spread over
// the SMs, so a warp's chain is one load of its head, its position and block-table entry (issued
// together), then the writes: a block per row looping its warps over 48 heads had two such chains
// (5.3 us a layer).
template <KvDtype D>
__global__ void RopeWriteKvKernel(float* qkv, const float* bias, QkvLayout layout, KvHeadRange range, RowMeta meta,
                                  KvGeometry g, KvLayerView layer, const float* inv_freq, unsigned long long* clamps) {
  using Codec = KvCodec<D>;
  TriggerDependents();  // the attention that follows may start its prologue (see PagedAttention)
  const int row = blockIdx.x, lane = threadIdx.x & 31;
  const int local = blockIdx.y * kHeadsPerBlock + (threadIdx.x >> 5);
  const int hd = g.head_dim, half = hd / 2, kvh = g.kv_heads;
  const int group = layout.heads / kvh, q_heads = range.count * group;
  if (local >= q_heads + 2 * range.count) return;
  const bool is_q = local < q_heads, is_v = local >= q_heads + range.count;
  const int kv_head = range.begin + (is_v ? local - q_heads - range.count : local - q_heads);
  const int at = is_q ? layout.Q(range.begin * group + local) : is_v ? layout.V(kv_head) : layout.K(kv_head);
  float* x = qkv + static_cast<int64_t>(row) * layout.width();
  const int pos_i = meta.pos[row];
  const float pos = static_cast<float>(pos_i);
  const int64_t slot = is_q ? 0 : CacheSlot(BlockTableRow(meta, g, row), g.block_size, pos_i);
  int clamped = 0;
  float* v = x + at;
  const float* b = bias ? bias + at : nullptr;
  float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    lo[j] = hi[j] = 0.0f;
    if (i >= half) continue;
    float a = v[i], c = v[i + half];
    if (b) a += b[i], c += b[i + half];
    if (!is_v) {  // rotate-half RoPE; the angle in fp32 as transformers computes it
      float s, co;
      sincosf(pos * inv_freq[i], &s, &co);
      const float ra = a * co - c * s, rc = c * co + a * s;
      a = ra, c = rc;
    }
    lo[j] = a, hi[j] = c;
  }
  if (is_q) {  // back in place for attention
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < half) v[i] = lo[j], v[i + half] = hi[j];
    }
    return;
  }
  float scale = 1.0f;
  if (Codec::kScaled) {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) amax = fmaxf(amax, fmaxf(fabsf(lo[j]), fabsf(hi[j])));
    scale = HeadScale<Codec>(WarpMax(amax));
    if (lane == 0) (is_v ? layer.v_scale : layer.k_scale)[slot * kvh + kv_head] = scale;
  }
  auto* dst = static_cast<typename Codec::Storage*>(is_v ? layer.v : layer.k) + (slot * kvh + kv_head) * hd;
  const float inv_scale = 1.0f / scale;
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) continue;
    dst[i] = EncodeCounted<Codec>(lo[j], inv_scale, &clamped);
    dst[i + half] = EncodeCounted<Codec>(hi[j], inv_scale, &clamped);
  }
  if (clamped) atomicAdd(clamps, static_cast<unsigned long long>(clamped));
}

template <KvDtype D>
__global__ void ReadKvKernel(KvGeometry g, KvLayerView layer, bool value, int64_t slot, int kv_head, float* out) {
  using Codec = KvCodec<D>;
  const auto* src = static_cast<const typename Codec::Storage*>(value ? layer.v : layer.k) + (slot * g.kv_heads + kv_head) * g.head_dim;
  const float scale = Codec::kScaled ? (value ? layer.v_scale : layer.k_scale)[slot * g.kv_heads + kv_head] : 1.0f;
  for (int i = threadIdx.x; i < g.head_dim; i += blockDim.x) out[i] = Codec::Decode(src[i]) * scale;
}

}  // namespace

absl::Status RopeWriteKv(float* qkv, const float* bias, int rows, int heads, const RowMeta& meta,
                         const KvGeometry& g, const KvLayerView& layer, const float* inv_freq,
                         unsigned long long* clamps, cudaStream_t stream, int qkv_groups, KvHeadRange range) {
  if (g.head_dim > 2 * 32 * kMaxPairsPerLane || g.head_dim % 2) {
    return absl::InvalidArgumentError("RopeWriteKv: head_dim must be even and at most 256");
  }
  if (range.count == 0) range = {0, g.kv_heads};
  if (qkv_groups < 1 || g.kv_heads % qkv_groups || heads % g.kv_heads || range.begin < 0 || range.count < 0 ||
      range.begin + range.count > g.kv_heads) {
    return absl::InvalidArgumentError("RopeWriteKv: groups must divide the KV heads, the range must lie within them");
  }
  if (rows == 0) return absl::OkStatus();
  const QkvLayout layout{.heads = heads, .kv_heads = g.kv_heads, .head_dim = g.head_dim, .groups = qkv_groups};
  const int warps = range.count * (heads / g.kv_heads + 2);
  const dim3 grid(rows, (warps + kHeadsPerBlock - 1) / kHeadsPerBlock), block(32 * kHeadsPerBlock);
  switch (g.dtype) {
    case KvDtype::kFp8E4M3:
      RopeWriteKvKernel<KvDtype::kFp8E4M3><<<grid, block, 0, stream>>>(qkv, bias, layout, range, meta, g, layer, inv_freq, clamps);
      break;
    case KvDtype::kFp8E5M2:
      RopeWriteKvKernel<KvDtype::kFp8E5M2><<<grid, block, 0, stream>>>(qkv, bias, layout, range, meta, g, layer, inv_freq, clamps);
      break;
    case KvDtype::kFp16:
      RopeWriteKvKernel<KvDtype::kFp16><<<grid, block, 0, stream>>>(qkv, bias, layout, range, meta, g, layer, inv_freq, clamps);
      break;
  }
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ReadKvForTest(const KvGeometry& g, const KvLayerView& layer, bool value, int block, int slot,
                           int kv_head, float* out, cudaStream_t stream) {
  const int64_t s = static_cast<int64_t>(block) * g.block_size + slot;
  switch (g.dtype) {
    case KvDtype::kFp8E4M3: ReadKvKernel<KvDtype::kFp8E4M3><<<1, 128, 0, stream>>>(g, layer, value, s, kv_head, out); break;
    case KvDtype::kFp8E5M2: ReadKvKernel<KvDtype::kFp8E5M2><<<1, 128, 0, stream>>>(g, layer, value, s, kv_head, out); break;
    case KvDtype::kFp16: ReadKvKernel<KvDtype::kFp16><<<1, 128, 0, stream>>>(g, layer, value, s, kv_head, out); break;
  }
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
