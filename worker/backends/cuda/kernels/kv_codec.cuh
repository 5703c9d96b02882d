#pragma once
// Encoding and decoding of one KV element for each cache dtype.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "worker/backends/cuda/kernels/kv_cache.h"

namespace tailserve::cuda {

template <KvDtype D>
struct KvCodec;

template <>
struct KvCodec<KvDtype::kFp8E4M3> {
  using Storage = __nv_fp8_e4m3;
  static constexpr float kMax = 448.0f;
  static constexpr bool kScaled = true;
  __device__ static Storage Encode(float v) { return Storage(v); }
  __device__ static float Decode(Storage s) { return static_cast<float>(s); }
};

template <>
struct KvCodec<KvDtype::kFp8E5M2> {
  using Storage = __nv_fp8_e5m2;
  static constexpr float kMax = 57344.0f;
  static constexpr bool kScaled = true;
  __device__ static Storage Encode(float v) { return Storage(v); }
  __device__ static float Decode(Storage s) { return static_cast<float>(s); }
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

}  // namespace tailserve::cuda
