#pragma once
// Device-side helpers for the paged KV cache: where a position lives, and encoding and decoding of
// one element for each cache dtype.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "worker/backends/cuda/kernels/kv_cache.h"

namespace tailserve::cuda {

// The block-table row of the sequence `row` belongs to.
__device__ __forceinline__ const int32_t* BlockTableRow(const RowMeta& meta, const KvGeometry& g, int row) {
  return meta.block_table + static_cast<int64_t>(meta.seq[row]) * g.max_blocks_per_seq;
}

// The cache slot (block · block_size + offset) holding position p of a sequence.
__device__ __forceinline__ int64_t CacheSlot(const int32_t* blocks, int block_size, int p) {
  return static_cast<int64_t>(blocks[p / block_size]) * block_size + p % block_size;
}

template <KvDtype D>
struct KvCodec;

// FP8 elements are stored scaled (per token and KV head) and converted by the cuda_fp8 types.
template <typename S>
struct Fp8Codec {
  using Storage = S;
  static constexpr bool kScaled = true;
  __device__ static Storage Encode(float v) { return Storage(v); }
  __device__ static float Decode(Storage s) { return static_cast<float>(s); }
};

template <>
struct KvCodec<KvDtype::kFp8E4M3> : Fp8Codec<__nv_fp8_e4m3> {
  static constexpr float kMax = 448.0f;
};

template <>
struct KvCodec<KvDtype::kFp8E5M2> : Fp8Codec<__nv_fp8_e5m2> {
  static constexpr float kMax = 57344.0f;
};

template <>
struct KvCodec<KvDtype::kFp16> {
  using Storage = __half;
  static constexpr float kMax = 65504.0f;
  static constexpr bool kScaled = false;
  __device__ static Storage Encode(float v) { return __float2half_rn(v); }
  __device__ static float Decode(Storage s) { return __half2float(s); }
};

// Clamps to the representable range; NaN becomes 0. Returns whether anything was changed.
__device__ __forceinline__ bool ClampFinite(float* v, float max) {
  if (isnan(*v)) {
    *v = 0.0f;
    return true;
  }
  if (*v > max) {
    *v = max;
    return true;
  }
  if (*v < -max) {
    *v = -max;
    return true;
  }
  return false;
}

// The scale of one token's head whose largest magnitude (over the head) is amax: amax maps to the
// format's largest value. 1 for unscaled formats, an all-zero head, or a non-finite amax (whose
// values EncodeCounted then clamps and counts).
template <typename Codec>
__device__ __forceinline__ float HeadScale(float amax) {
  return Codec::kScaled && amax > 0.0f && isfinite(amax) ? amax / Codec::kMax : 1.0f;
}

// x · inv_scale in the cache format, clamped, never inf/NaN. With a per-head scale a finite value
// can pass kMax only by rounding: clamped, but counted (*clamped += 1) only when it really did not
// fit (a non-finite input, or beyond an unscaled format's range).
template <typename Codec>
__device__ __forceinline__ typename Codec::Storage EncodeCounted(float x, float inv_scale, int* clamped) {
  float e = x * inv_scale;
  *clamped += ClampFinite(&e, Codec::kMax) && !(Codec::kScaled && isfinite(x));
  return Codec::Encode(e);
}

}  // namespace tailserve::cuda
