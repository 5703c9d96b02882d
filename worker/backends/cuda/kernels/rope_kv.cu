#include "worker/backends/cuda/kernels/rope_kv.h"

#include <algorithm>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/kv_codec.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256
constexpr int kHeadsPerBlock = 4;
// Packed (max_ctas): CTAs of 32 warps, each warp loading kPackedItems heads at once, head_dim <= 128.
constexpr int kPackedThreads = 1024;
constexpr int kPackedPairs = 2;
constexpr int kPackedItems = 2;

// Loads one head's projection into lo / hi (lane's pairs lane + 32 j; 0 past head_dim / 2): the
// sum of `parts` arrays `stride` floats apart from src, all loads issued before any is used.
template <int kPairs>
__device__ __forceinline__ void LoadHead(const float* src, int parts, int64_t stride, int half, float (&lo)[kPairs],
                                         float (&hi)[kPairs]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    lo[j] = hi[j] = 0.0f;
    if (i >= half) continue;
#pragma unroll
    for (int p = 0; p < kMaxPartials; ++p) {
      if (p < parts) lo[j] += src[p * stride + i], hi[j] += src[p * stride + i + half];
    }
  }
}

// Adds the bias to one head's projection, which a warp holds as lo / hi (lane's pairs lane + 32 j),
// rotates it (q and k heads), and writes it: q back into qkv's row, k and v encoded into the cache.
template <KvDtype D, int kPairs>
__device__ __forceinline__ void RotateAndWrite(float (&lo)[kPairs], float (&hi)[kPairs], float* row_qkv,
                                               const float* bias, int head, int heads, float pos, int64_t slot,
                                               const KvGeometry& g, const KvLayerView& layer, const float* inv_freq,
                                               int* clamped) {
  using Codec = KvCodec<D>;
  const int lane = threadIdx.x & 31, hd = g.head_dim, half = hd / 2, kvh = g.kv_heads;
  const bool is_v = head >= heads + kvh;
  const float* b = bias ? bias + head * hd : nullptr;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
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
  if (head < heads) {  // q: back into qkv for attention
    float* v = row_qkv + head * hd;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
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
    for (int j = 0; j < kPairs; ++j) amax = fmaxf(amax, fmaxf(fabsf(lo[j]), fabsf(hi[j])));
    scale = HeadScale<Codec>(WarpMax(amax));
    if (lane == 0) (is_v ? layer.v_scale : layer.k_scale)[slot * kvh + kv_head] = scale;
  }
  auto* dst = static_cast<typename Codec::Storage*>(is_v ? layer.v : layer.k) + (slot * kvh + kv_head) * hd;
  const float inv_scale = 1.0f / scale;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) continue;
    dst[i] = EncodeCounted<Codec>(lo[j], inv_scale, clamped);
    dst[i + half] = EncodeCounted<Codec>(hi[j], inv_scale, clamped);
  }
}

// Grid (rows, heads / 4): a warp per head (q heads, then k heads, then v heads), each lane the
// rotation pairs lane, lane + 32, ... One head a warp and blocks spread over the SMs, so a warp's
// chain is one load of its head, its position and block-table entry (issued together), then the
// writes: a block per row looping its warps over 48 heads had two such chains (5.3 us a layer).
template <KvDtype D>
__global__ void RopeWriteKvKernel(float* qkv, Partials in, const float* bias, int heads, RowMeta meta, KvGeometry g,
                                  KvLayerView layer, const float* inv_freq, unsigned long long* clamps) {
  TriggerDependents();  // the attention that follows may start its prologue (see PagedAttention)
  const int row = blockIdx.x;
  const int head = blockIdx.y * kHeadsPerBlock + (threadIdx.x >> 5);
  const int hd = g.head_dim, half = hd / 2, kvh = g.kv_heads;
  if (head >= heads + 2 * kvh) return;
  const int width = (heads + 2 * kvh) * hd;
  float* x = qkv + static_cast<int64_t>(row) * width;
  const int pos_i = meta.pos[row];
  const int64_t slot = head < heads ? 0 : CacheSlot(BlockTableRow(meta, g, row), g.block_size, pos_i);
  GridDependencyWait();  // qkv is the previous kernel's (the step's inputs above were written before it)
  // The projection: in place, or the sum of the partials (x's layout, in.stride floats apart).
  const float* src = in.count > 0 ? in.data + static_cast<int64_t>(row) * width + head * hd : x + head * hd;
  float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
  LoadHead(src, in.count > 0 ? in.count : 1, in.stride, half, lo, hi);  // all loads first: one round trip
  int clamped = 0;
  RotateAndWrite<D>(lo, hi, x, bias, head, heads, static_cast<float>(pos_i), slot, g, layer, inv_freq, &clamped);
  if (clamped) atomicAdd(clamps, static_cast<unsigned long long>(clamped));
}

// Packed (max_ctas): CTAs of 32 warps on a few SMs. A warp takes items (row, head) first, first +
// W, ... (W warps in the grid), kPackedItems at a time with all their loads issued together: one
// chain a pass, as the spread kernel's.
template <KvDtype D>
__global__ void __launch_bounds__(kPackedThreads, 1)
    PackedRopeWriteKvKernel(float* qkv, Partials in, const float* bias, int rows, int heads, RowMeta meta,
                            KvGeometry g, KvLayerView layer, const float* inv_freq, unsigned long long* clamps) {
  TriggerDependents();
  const int hd = g.head_dim, half = hd / 2, per_row = heads + 2 * g.kv_heads;
  const int width = per_row * hd, items = rows * per_row;
  const int warps = gridDim.x * (blockDim.x >> 5);
  const float* src_base = in.count > 0 ? in.data : qkv;
  const int parts = in.count > 0 ? in.count : 1;
  int clamped = 0;
  for (int first = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); first < items; first += kPackedItems * warps) {
    int row[kPackedItems], head[kPackedItems], pos[kPackedItems];
    int64_t slot[kPackedItems];
#pragma unroll
    for (int t = 0; t < kPackedItems; ++t) {
      const int item = first + t * warps;
      row[t] = item < items ? item / per_row : -1;
      head[t] = item % per_row;
      pos[t] = row[t] >= 0 ? meta.pos[row[t]] : 0;
      slot[t] = row[t] >= 0 && head[t] >= heads ? CacheSlot(BlockTableRow(meta, g, row[t]), g.block_size, pos[t]) : 0;
    }
    GridDependencyWait();  // once per pass: a no-op after the first
    float lo[kPackedItems][kPackedPairs], hi[kPackedItems][kPackedPairs];
#pragma unroll
    for (int t = 0; t < kPackedItems; ++t) {  // an item past the end loads nothing (as if head_dim 0)
      LoadHead(src_base + static_cast<int64_t>(row[t]) * width + head[t] * hd, parts, in.stride,
               row[t] >= 0 ? half : 0, lo[t], hi[t]);
    }
#pragma unroll
    for (int t = 0; t < kPackedItems; ++t) {
      if (row[t] < 0) continue;
      RotateAndWrite<D>(lo[t], hi[t], qkv + static_cast<int64_t>(row[t]) * width, bias, head[t], heads,
                        static_cast<float>(pos[t]), slot[t], g, layer, inv_freq, &clamped);
    }
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
                         unsigned long long* clamps, cudaStream_t stream, bool overlap_previous, int max_ctas) {
  if (g.head_dim > 2 * 32 * kMaxPairsPerLane || g.head_dim % 2) {
    return absl::InvalidArgumentError("RopeWriteKv: head_dim must be even and at most 256");
  }
  if (max_ctas < 0) return absl::InvalidArgumentError("RopeWriteKv: max_ctas must be >= 0");
  const Partials parts = in.OrNone();
  if (parts.count > kMaxPartials) return absl::InvalidArgumentError("RopeWriteKv: at most 4 partials");
  if (rows == 0) return absl::OkStatus();
  const int per_row = heads + 2 * g.kv_heads;
  auto launch = [&](auto spread, auto packed) {
    if (max_ctas > 0 && g.head_dim <= 2 * 32 * kPackedPairs) {
      const int warps = kPackedThreads / 32, blocks = std::min(max_ctas, (rows * per_row + warps - 1) / warps);
      return LaunchMaybeOverlapped(overlap_previous, dim3(blocks), dim3(kPackedThreads), 0, stream, packed, qkv, parts,
                                   bias, rows, heads, meta, g, layer, inv_freq, clamps);
    }
    const dim3 grid(rows, (per_row + kHeadsPerBlock - 1) / kHeadsPerBlock), block(32 * kHeadsPerBlock);
    return LaunchMaybeOverlapped(overlap_previous, grid, block, 0, stream, spread, qkv, parts, bias, heads, meta, g,
                                 layer, inv_freq, clamps);
  };
  switch (g.dtype) {
    case KvDtype::kFp8E4M3:
      TAILSERVE_CUDA_RETURN_IF_ERROR(
          launch(RopeWriteKvKernel<KvDtype::kFp8E4M3>, PackedRopeWriteKvKernel<KvDtype::kFp8E4M3>));
      break;
    case KvDtype::kFp8E5M2:
      TAILSERVE_CUDA_RETURN_IF_ERROR(
          launch(RopeWriteKvKernel<KvDtype::kFp8E5M2>, PackedRopeWriteKvKernel<KvDtype::kFp8E5M2>));
      break;
    case KvDtype::kFp16:
      TAILSERVE_CUDA_RETURN_IF_ERROR(launch(RopeWriteKvKernel<KvDtype::kFp16>, PackedRopeWriteKvKernel<KvDtype::kFp16>));
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
