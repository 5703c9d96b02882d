#include "worker/backends/cuda/kernels/rope_kv.h"

#include <algorithm>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/kv_codec.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256
constexpr int kHeadsPerBlock = 4;

// Grid (rows, heads / 4): a warp per head (q heads, then k heads, then v heads), each lane the
// rotation pairs lane, lane + 32, ... One head a warp and blocks spread over the SMs, so a warp's
// chain is one load of its head, its position and block-table entry (issued together), then the
// writes: a block per row looping its warps over 48 heads had two such chains (5.3 us a layer).
template <KvDtype D>
__global__ void RopeWriteKvKernel(float* qkv, Partials in, const float* bias, int heads, RowMeta meta, KvGeometry g,
                                  KvLayerView layer, const float* inv_freq, unsigned long long* clamps) {
  using Codec = KvCodec<D>;
  TriggerDependents();  // the attention that follows may start its prologue (see PagedAttention)
  const int row = blockIdx.x, lane = threadIdx.x & 31;
  const int head = blockIdx.y * kHeadsPerBlock + (threadIdx.x >> 5);
  const int hd = g.head_dim, half = hd / 2, kvh = g.kv_heads;
  if (head >= heads + 2 * kvh) return;
  const int width = (heads + 2 * kvh) * hd;
  float* x = qkv + static_cast<int64_t>(row) * width;
  const int pos_i = meta.pos[row];
  const float pos = static_cast<float>(pos_i);
  const int64_t slot = head < heads ? 0 : CacheSlot(BlockTableRow(meta, g, row), g.block_size, pos_i);
  GridDependencyWait();  // qkv is the previous kernel's (the step's inputs above were written before it)
  int clamped = 0;
  const bool is_v = head >= heads + kvh;
  float* v = x + head * hd;
  // The projection: in place, or the sum of the partials (x's layout, in.stride floats apart).
  const float* src = in.count > 0 ? in.data + static_cast<int64_t>(row) * width + head * hd : v;
  const int parts = in.count > 0 ? in.count : 1;
  const int64_t part_stride = in.stride;
  const float* b = bias ? bias + head * hd : nullptr;
  float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {  // all loads first: one round trip
    const int i = lane + 32 * j;
    lo[j] = hi[j] = 0.0f;
    if (i >= half) continue;
#pragma unroll
    for (int p = 0; p < kMaxPartials; ++p) {
      if (p < parts) lo[j] += src[p * part_stride + i], hi[j] += src[p * part_stride + i + half];
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) continue;
    float a = lo[j], c = hi[j];
    if (b) a += b[i], c += b[i + half];
    if (!is_v) {  // rotate-half RoPE; the angle in fp32 as transformers computes it
      float s, co;
      sincosf(pos * inv_freq[i], &s, &co);
      const float ra = a * co - c * s, rc = c * co + a * s;
      a = ra, c = rc;
    }
    lo[j] = a, hi[j] = c;
  }
  if (head < heads) {  // q: back in place for attention
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < half) v[i] = lo[j], v[i + half] = hi[j];
    }
    return;
  }
  const int kv_head = is_v ? head - heads - kvh : head - heads;
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

absl::Status RopeWriteKv(float* qkv, const Partials& in, const float* bias, int rows, int heads, const RowMeta& meta,
                         const KvGeometry& g, const KvLayerView& layer, const float* inv_freq,
                         unsigned long long* clamps, cudaStream_t stream, bool overlap_previous) {
  if (g.head_dim > 2 * 32 * kMaxPairsPerLane || g.head_dim % 2) {
    return absl::InvalidArgumentError("RopeWriteKv: head_dim must be even and at most 256");
  }
  const Partials parts = in.OrNone();
  if (parts.count > kMaxPartials) return absl::InvalidArgumentError("RopeWriteKv: at most 4 partials");
  if (rows == 0) return absl::OkStatus();
  const dim3 grid(rows, (heads + 2 * g.kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock), block(32 * kHeadsPerBlock);
  auto launch = [&](auto kernel) {
    return LaunchMaybeOverlapped(overlap_previous, grid, block, 0, stream, kernel, qkv, parts, bias,
                                 heads, meta, g, layer, inv_freq, clamps);
  };
  switch (g.dtype) {
    case KvDtype::kFp8E4M3: TAILSERVE_CUDA_RETURN_IF_ERROR(launch(RopeWriteKvKernel<KvDtype::kFp8E4M3>)); break;
    case KvDtype::kFp8E5M2: TAILSERVE_CUDA_RETURN_IF_ERROR(launch(RopeWriteKvKernel<KvDtype::kFp8E5M2>)); break;
    case KvDtype::kFp16: TAILSERVE_CUDA_RETURN_IF_ERROR(launch(RopeWriteKvKernel<KvDtype::kFp16>)); break;
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
