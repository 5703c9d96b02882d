#include "worker/backends/cuda/kernels/rows.h"

#include <algorithm>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

// kVec (hidden % 8 == 0): each thread issues up to kEmbedBatch 16-byte loads of the row before it
// stores any, so a row of up to kEmbedBatch · 8 · threads values is one DRAM round trip. The scalar
// loop stored each value before loading the next (the compiler cannot reorder a load past a store
// that may alias it): on the 8B shape 16 round trips a thread, ~9 µs at the start of every step.
constexpr int kEmbedBatch = 4;

template <bool kVec>
__global__ void EmbedKernel(const __half* table, const int32_t* tokens, int hidden, float* x, float* sumsq,
                            int sumsq_slots) {
  __shared__ float shared[32];
  const int r = blockIdx.x;
  if (r == 0) {
    for (int i = gridDim.x + threadIdx.x; i < sumsq_slots; i += blockDim.x) sumsq[i] = 0.0f;
  }
  const __half* src = table + static_cast<int64_t>(tokens[r]) * hidden;
  float* dst = x + static_cast<int64_t>(r) * hidden;
  float sum = 0.0f;
  if constexpr (kVec) {
    const int vecs = hidden / 8;
    for (int base = threadIdx.x; base < vecs; base += kEmbedBatch * blockDim.x) {
      uint4 raw[kEmbedBatch];
#pragma unroll
      for (int j = 0; j < kEmbedBatch; ++j) {
        const int v = base + j * blockDim.x;
        if (v < vecs) raw[j] = reinterpret_cast<const uint4*>(src)[v];
      }
#pragma unroll
      for (int j = 0; j < kEmbedBatch; ++j) {
        const int v = base + j * blockDim.x;
        if (v >= vecs) break;
        const __half2* h = reinterpret_cast<const __half2*>(&raw[j]);
        float f[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 p = __half22float2(h[i]);
          f[2 * i] = p.x, f[2 * i + 1] = p.y;
          sum += p.x * p.x + p.y * p.y;
        }
        reinterpret_cast<float4*>(dst)[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(dst)[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    }
  } else {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      const float v = __half2float(src[i]);
      dst[i] = v;
      sum += v * v;
    }
  }
  if (sumsq == nullptr) return;
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) sumsq[r] = sum;
}

// One block per row. kVec (hidden % 4 == 0, at most kMax float4 a thread: see RmsNormRows): each
// thread loads its float4s (and the arrays it adds) once and keeps them for the scaled write, where
// the scalar path reads the row twice. kMax 2 keeps those loads in 64 registers for 1024 threads;
// 4 (hidden above 8192) spills some.
template <bool kVec, int kMax = 1>
__global__ void __launch_bounds__(1024)
    RmsNormKernel(float* x, Partials add, const int32_t* src, int hidden, const float* w, float eps, __half* out,
                  bool trigger_first) {
  // A programmatic follower (StreamFfn, StreamGemm) streams its constant W during the norm; with
  // trigger_first also during the previous kernel's last CTAs (RmsNormRows says when that is safe).
  if (trigger_first) TriggerDependents();
  GridDependencyWait();  // everything it reads may be the previous kernel's
  if (!trigger_first) TriggerDependents();
  __shared__ float shared[32];
  const int r = blockIdx.x;
  const int64_t row = static_cast<int64_t>(src ? src[r] : r) * hidden;
  float* xr = x + row;
  const float* ar = add.count > 0 ? add.data + row : nullptr;
  __half* o = out + static_cast<int64_t>(r) * hidden;
  if constexpr (kVec) {
    const int n4 = hidden / 4;
    float4 v[kMax], a[kMax][kMaxPartials];
    float sum = 0;
    // Every load before the first store (which may alias them): one round trip, not one a float4.
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      v[j] = i < n4 ? reinterpret_cast<const float4*>(xr)[i] : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int p = 0; p < kMaxPartials; ++p) {
        a[j][p] = ar && p < add.count && i < n4 ? reinterpret_cast<const float4*>(ar + p * add.stride)[i]
                                                : make_float4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (ar && i < n4) {
#pragma unroll
        for (int p = 0; p < kMaxPartials; ++p) {
          v[j].x += a[j][p].x, v[j].y += a[j][p].y, v[j].z += a[j][p].z, v[j].w += a[j][p].w;
        }
        reinterpret_cast<float4*>(xr)[i] = v[j];
      }
      sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    const float inv = rsqrtf(BlockSum(sum, shared) / hidden + eps);
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i >= n4) break;
      const float4 g = w ? reinterpret_cast<const float4*>(w)[i] : make_float4(1, 1, 1, 1);
      const __half2 lo = __floats2half2_rn(g.x * (v[j].x * inv), g.y * (v[j].y * inv));
      const __half2 hi = __floats2half2_rn(g.z * (v[j].z * inv), g.w * (v[j].w * inv));
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo), packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      reinterpret_cast<uint2*>(o)[i] = packed;
    }
  } else {
    float sum = 0;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      if (ar) {  // this thread reads it back below
        for (int p = 0; p < add.count; ++p) xr[i] += ar[p * add.stride + i];
      }
      sum += xr[i] * xr[i];
    }
    const float inv = rsqrtf(BlockSum(sum, shared) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = __float2half((w ? w[i] : 1.0f) * (xr[i] * inv));
  }
}

// Gate and up interleave, so a float4 holds two outputs' inputs: one 16-byte load and one 4-byte
// store per two outputs (each thread took one output with 4-byte loads: 3.9 us at batch 64).
// With `in`, the input is the sum of its arrays (a split-K projection's chunks), gate_up unread.
// It triggers after its wait, so a programmatic follower (StreamGemm) copies its W meanwhile.
__global__ void SwiGluKernel(const float* gate_up, int64_t total, __half* out, Partials in) {
  GridDependencyWait();
  TriggerDependents();
  const int64_t pairs = total / 2;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int parts = in.count > 0 ? in.count : 1;
  const float* src = in.count > 0 ? in.data : gate_up;
  for (int64_t p = first; p < pairs; p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 c[kMaxPartials];
#pragma unroll
    for (int i = 0; i < kMaxPartials; ++i) {  // all loads first: one round trip
      if (i < parts) c[i] = reinterpret_cast<const float4*>(src + i * in.stride)[p];
    }
    float4 v = c[0];
#pragma unroll
    for (int i = 1; i < kMaxPartials; ++i) {
      if (i < parts) v.x += c[i].x, v.y += c[i].y, v.z += c[i].z, v.w += c[i].w;
    }
    reinterpret_cast<__half2*>(out)[p] = __floats2half2_rn(Silu(v.x) * v.y, Silu(v.z) * v.w);
  }
  if (first == 0 && total % 2) {
    float g = 0.0f, u = 0.0f;
    for (int i = 0; i < parts; ++i) g += src[i * in.stride + 2 * total - 2], u += src[i * in.stride + 2 * total - 1];
    out[total - 1] = __float2half(Silu(g) * u);
  }
}

__global__ void AddBiasKernel(float* x, int64_t total, int n, const float* bias) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += bias[i % n];
  }
}

__global__ void AddScaledRowsKernel(float* x, const float* y, const float* weights, int weight_stride, int n) {
  const int r = blockIdx.x;
  const float w = weights[static_cast<int64_t>(r) * weight_stride];
  if (w == 0.0f) return;
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[static_cast<int64_t>(r) * n + i] += w * y[static_cast<int64_t>(r) * n + i];
}

__global__ void MoeRouterLogitsKernel(const float* x, int hidden, const float* w, float eps, const float* router,
                                      int experts, float* logits) {
  __shared__ float shared[32];
  const int r = blockIdx.x;
  const float* xr = x + static_cast<int64_t>(r) * hidden;
  float sum = 0;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) sum += xr[i] * xr[i];
  const float inv = rsqrtf(BlockSum(sum, shared) / hidden + eps);
  for (int e = 0; e < experts; ++e) {
    const float* we = router + static_cast<int64_t>(e) * hidden;
    float dot = 0;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dot += w[i] * (xr[i] * inv) * we[i];
    dot = BlockSum(dot, shared);
    if (threadIdx.x == 0) logits[static_cast<int64_t>(r) * experts + e] = dot;
  }
}

// One thread per row: expert counts are small (8 for Mixtral; at most 64).
__global__ void MoeRouteKernel(const float* logits, int rows, int experts, int top_k, float* weights) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* l = logits + static_cast<int64_t>(r) * experts;
  float* w = weights + static_cast<int64_t>(r) * experts;
  float max = -INFINITY;
  for (int e = 0; e < experts; ++e) max = fmaxf(max, l[e]);
  float total = 0;
  for (int e = 0; e < experts; ++e) total += expf(l[e] - max);
  uint64_t chosen = 0;
  float kept = 0;
  for (int k = 0; k < top_k; ++k) {  // highest probability first, lower index on ties
    int best = -1;
    for (int e = 0; e < experts; ++e) {
      if (!(chosen >> e & 1) && (best < 0 || l[e] > l[best])) best = e;
    }
    chosen |= uint64_t{1} << best;
    kept += expf(l[best] - max) / total;
  }
  for (int e = 0; e < experts; ++e) w[e] = (chosen >> e & 1) ? expf(l[e] - max) / total / kept : 0.0f;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int GridFor(int64_t total, int threads) {
  return static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 65535));
}

}  // namespace

absl::Status EmbedRows(const EmbedArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return absl::OkStatus();
  if (a.sumsq_slots > 0 && (a.sumsq == nullptr || a.sumsq_slots < a.rows)) {
    return absl::InvalidArgumentError("EmbedRows: sumsq_slots needs sumsq and at least one slot a row");
  }
  const bool vec = a.hidden % 8 == 0 && Aligned16(a.table) && Aligned16(a.x);
  (vec ? EmbedKernel<true> : EmbedKernel<false>)<<<a.rows, 256, 0, stream>>>(a.table, a.tokens, a.hidden, a.x, a.sumsq,
                                                                              a.sumsq_slots);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status RmsNormRows(float* x, const Partials& add, const int32_t* src, int rows, int hidden, const float* weight,
                         float eps, __half* out, cudaStream_t stream, bool overlap_previous, bool trigger_first) {
  if (rows == 0) return absl::OkStatus();
  // Enough threads that each handles a few elements: a short dependency chain per row, since at
  // decode there are only a few rows (blocks). Two float4 a thread where the row is whole float4s.
  const Partials a = add.OrNone();
  if (a.count > kMaxPartials) return absl::InvalidArgumentError("RmsNormRows: at most 4 arrays to add");
  const bool add_aligned = a.count == 0 || (Aligned16(a.data) && a.stride % 4 == 0);
  if (hidden % 4 == 0 && hidden <= 4 * 4 * 1024 && Aligned16(x) && add_aligned && Aligned16(weight) &&
      Aligned16(out)) {
    const int threads = std::clamp((hidden / 8 + 31) / 32 * 32, 32, 1024);
    const int n4_per_thread = (hidden / 4 + threads - 1) / threads;
    TAILSERVE_CUDA_RETURN_IF_ERROR(LaunchMaybeOverlapped(overlap_previous, dim3(rows), dim3(threads), 0, stream,
                                                         n4_per_thread <= 2 ? RmsNormKernel<true, 2>
                                                                            : RmsNormKernel<true, 4>,
                                                         x, a, src, hidden, weight, eps, out, trigger_first));
  } else {
    const int threads = std::clamp((hidden / 4 + 31) / 32 * 32, 32, 1024);
    TAILSERVE_CUDA_RETURN_IF_ERROR(LaunchMaybeOverlapped(overlap_previous, dim3(rows), dim3(threads), 0, stream,
                                                         RmsNormKernel<false>, x, a, src, hidden, weight, eps, out,
                                                         trigger_first));
  }
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status SwiGlu(const float* gate_up, int rows, int ffn, __half* out, cudaStream_t stream, bool overlap_previous,
                    const Partials& in) {
  const int64_t total = static_cast<int64_t>(rows) * ffn;
  if (total == 0) return absl::OkStatus();
  const Partials parts = in.OrNone();
  if (parts.count > kMaxPartials) return absl::InvalidArgumentError("SwiGlu: at most 4 partials");
  if (!Aligned16(parts.count > 0 ? parts.data : gate_up) || !Aligned16(out) || parts.stride % 4 != 0) {
    return absl::InvalidArgumentError("SwiGlu: buffers 16-byte aligned");
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(LaunchMaybeOverlapped(overlap_previous, dim3(GridFor(std::max<int64_t>(total / 2, 1), 256)),
                                                       dim3(256), 0, stream, SwiGluKernel, gate_up, total, out, parts));
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status AddBias(float* x, int rows, int n, const float* bias, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * n;
  if (total == 0) return absl::OkStatus();
  AddBiasKernel<<<GridFor(total, 256), 256, 0, stream>>>(x, total, n, bias);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status AddScaledRows(float* x, const float* y, const float* weights, int weight_stride, int rows, int n,
                           cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  AddScaledRowsKernel<<<rows, 256, 0, stream>>>(x, y, weights, weight_stride, n);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status MoeRouterLogits(const float* x, int rows, int hidden, const float* norm_weight, float eps,
                             const float* router, int experts, float* logits, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  MoeRouterLogitsKernel<<<rows, 256, 0, stream>>>(x, hidden, norm_weight, eps, router, experts, logits);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status MoeRoute(const float* logits, int rows, int experts, int top_k, float* weights, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  MoeRouteKernel<<<(rows + 127) / 128, 128, 0, stream>>>(logits, rows, experts, top_k, weights);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
