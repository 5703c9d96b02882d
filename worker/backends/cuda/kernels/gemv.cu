#include "worker/backends/cuda/kernels/gemv.h"

#include <algorithm>

#include <cuda_pipeline_primitives.h>

#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/per_device.h"

namespace tailserve::cuda {
namespace {

constexpr int kWarps = 8;

// Eight consecutive inputs at vector v, as floats.
__device__ __forceinline__ void LoadX(const GemvArgs& a, int v, float (&xf)[8]) {
  if (a.x_f32 != nullptr) {
    const float4* p = reinterpret_cast<const float4*>(a.x_f32) + 2 * v;
    const float4 lo = p[0], hi = p[1];
    xf[0] = lo.x, xf[1] = lo.y, xf[2] = lo.z, xf[3] = lo.w, xf[4] = hi.x, xf[5] = hi.y, xf[6] = hi.z, xf[7] = hi.w;
  } else {
    const uint4 raw = reinterpret_cast<const uint4*>(a.x)[v];
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      xf[2 * i] = f.x, xf[2 * i + 1] = f.y;
    }
  }
}

// A load issued where it is written: the compiler sinks a plain one to its use, past the warp sums
// it should overlap (coherent, as a plain load: what it reads is the previous kernel's).
__device__ __forceinline__ float LoadHere(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ int LoadHere(const int* p) {
  int v;
  asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// static_cast<float>, kept at its use: a plain cast of the position is folded back to where it is
// loaded, which makes the warp wait for that load before its sums.
__device__ __forceinline__ float IntToFloat(int i) {
  float f;
  asm("cvt.rn.f32.s32 %0, %1;" : "=f"(f) : "r"(i));
  return f;
}

__device__ __forceinline__ float Dot8(const uint4& w, const float (&xf)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&w);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    s += f.x * xf[2 * i] + f.y * xf[2 * i + 1];
  }
  return s;
}

// Shared memory a CTA may fill with W before its wait. Measured with the 8B o Gemv preloading
// (batch-1 step, one process each): none 4.13 ms, 8 KB 4.11, 16 KB 4.07, 32 KB 4.55 with the
// driver's shared-memory configuration, 4.02 with kPreloadConfigBytes. Against 32 KB in
// kPreloadConfigBytes (A/B, two rounds each, 12-03): 24 KB (5 CTAs fit: o's 512 CTAs in one
// wave, all preloading) +0.04-0.06 ms, 40 KB (still 3 CTAs, 3 MB more preloaded) +0.11.
constexpr int kMaxPreloadBytes = 32 << 10;
// The SM shared-memory configuration the preloading instances ask for. A large one slows the
// kernels chained after o on the SM (less L1, or SMs draining to change it back: not told apart):
// at 196 KB (the driver's choice for 6 CTAs of 33 KB) the step took 4.57 ms, at 164 KB 4.06, at
// 132 KB 4.02; 228 KB for every Gemv, even with no preload, 4.71. 132 KB holds 3 such CTAs (a
// CTA also takes 1 KB reserved and its static arrays), so o's 512 CTAs on the 8B are 1.3 waves.
constexpr int kPreloadConfigBytes = 132 << 10;
constexpr int kPreloadStepBytes = kWarps * 2 * 32 * 16;  // one step: every lane's two 16-byte W loads

// The deep instances' W loads in flight a lane: kDeepSteps steps of both columns, in batches.
constexpr int kDeepSteps = 4;
// CTAs an SM the deep instances are built for (their registers: ≤ 64 a thread).
constexpr int kDeepCtasPerSm = 4;

// A block's 8 warps take 8 / KS column pairs; the KS warps of a pair split its k range
// (interleaved 16-byte vectors) and meet in shared memory. Both columns of a pair share each load
// of x, and a lane keeps two W loads in flight per step. The first `preload` steps of W are copied
// into shared memory before the wait (each lane reads back only its own copies: no barrier).
// kDeep: a lane issues kDeepSteps steps of W loads (8 × 16 bytes) before it uses any, for grids of
// at most kDeepCtasPerSm CTAs an SM, where the 40-register instances leave SMs with ~31 warps
// streaming 64 bytes a lane (o and down on the 8B: one wave of 512 CTAs; ncu 2.7 / 3.6 TB/s).
template <int KS, bool kPreload, bool kDeep>
__device__ __forceinline__ void GemvBody(const GemvArgs& a, int preload) {
  if constexpr (!kPreload) preload = 0;
  extern __shared__ uint4 preload_s[];  // [warp][step][column of the pair][lane]
  __shared__ float part_s[kWarps][2];
  __shared__ float sumsq_s[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slice = warp % KS;
  const int pair = blockIdx.x * (kWarps / KS) + warp / KS;
  int c0 = 2 * pair, c1 = c0 + 1;
  if (a.rope_head_dim > 0) {  // columns i and i + head_dim / 2 of one head
    const int half = a.rope_head_dim / 2;
    c0 = pair / half * a.rope_head_dim + pair % half, c1 = c0 + half;
  }
  const bool has0 = c0 < a.n, has1 = c1 < a.n;
  const uint4* w0 = reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(has0 ? c0 : 0) * a.k);
  const uint4* w1 = reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(has1 ? c1 : has0 ? c0 : 0) * a.k);
  const int vecs = a.k / 8, first = slice * 32 + lane;
  uint4* mine = preload_s + warp * preload * 64 + lane;  // step j, column i at mine[64 j + 32 i]
  int preloaded = 0;
  if (has0) {  // W is never written: safe to read before the wait
    for (int v = first; preloaded < preload && v < vecs; ++preloaded, v += 32 * KS) {
      __pipeline_memcpy_async(mine + 64 * preloaded, w0 + v, 16);
      __pipeline_memcpy_async(mine + 64 * preloaded + 32, w1 + v, 16);
    }
    __pipeline_commit();
  }
  // Launched programmatically (overlap_previous), the CTAs are resident when the previous kernel
  // ends: ~0.3 µs a kernel boundary at batch 1 (8B: 4.18 → 4.14 ms). Prefetching W into L2 before
  // the wait did not help (docs/cuda-decode.md); shared memory cannot be evicted.
  GridDependencyWait();
  TriggerDependents();  // a programmatic follower fills SMs as CTAs finish
  float acc0 = 0.0f, acc1 = 0.0f;
  if (has0) {
    __pipeline_wait_prior(0);
    for (int j = 0; j < preloaded; ++j) {
      float xf[8];
      LoadX(a, first + j * 32 * KS, xf);
      acc0 += Dot8(mine[64 * j], xf);
      acc1 += Dot8(mine[64 * j + 32], xf);
    }
    int v = first + preloaded * 32 * KS;
    if constexpr (kDeep) {
      constexpr int kStride = 32 * KS;
      for (; v + (kDeepSteps - 1) * kStride < vecs; v += kDeepSteps * kStride) {
        uint4 wa[kDeepSteps], wb[kDeepSteps];
#pragma unroll
        for (int j = 0; j < kDeepSteps; ++j) wa[j] = w0[v + j * kStride], wb[j] = w1[v + j * kStride];
#pragma unroll
        for (int j = 0; j < kDeepSteps; ++j) {
          float xf[8];
          LoadX(a, v + j * kStride, xf);
          acc0 += Dot8(wa[j], xf);
          acc1 += Dot8(wb[j], xf);
        }
      }
    }
#pragma unroll 2
    for (; v < vecs; v += 32 * KS) {
      const uint4 wv0 = w0[v], wv1 = w1[v];
      float xf[8];
      LoadX(a, v, xf);
      acc0 += Dot8(wv0, xf);
      acc1 += Dot8(wv1, xf);
    }
  }
  // The epilogue's operands, loaded by the lane that uses them as the loop ends and before any of
  // them is used: one L2 round trip, under the warp sums (it was one after the merge, and in q/k/v
  // a second for RoPE's position and frequency after the sum of squares).
  const bool epilogue_lane = lane == 0 && slice == 0 && has0;
  const bool rope = a.swiglu_out == nullptr && a.rope_head_dim > 0 && c0 < a.rope_cols;
  float in_sumsq = 0.0f, bias0 = 0.0f, bias1 = 0.0f, y0 = 0.0f, y1 = 0.0f, freq = 0.0f;
  int rope_pos = 0;
  if (epilogue_lane) {
    if (a.in_sumsq != nullptr) in_sumsq = LoadHere(a.in_sumsq);
    if (a.swiglu_out == nullptr) {
      if (a.bias != nullptr) bias0 = LoadHere(a.bias + c0), bias1 = has1 ? LoadHere(a.bias + c1) : 0.0f;
      if (a.beta != 0.0f) y0 = LoadHere(a.y + c0), y1 = has1 ? LoadHere(a.y + c1) : 0.0f;
    }
    if (rope) {
      rope_pos = LoadHere(a.rope_pos);
      freq = LoadHere(a.rope_inv_freq + c0 % a.rope_head_dim);
    }
  }
  acc0 = WarpSum(acc0), acc1 = WarpSum(acc1);
  if (KS > 1) {
    if (lane == 0) part_s[warp][0] = acc0, part_s[warp][1] = acc1;
    __syncthreads();
    if (lane == 0 && slice == 0) {
#pragma unroll
      for (int k = 1; k < KS; ++k) acc0 += part_s[warp + k][0], acc1 += part_s[warp + k][1];
    }
  }
  float sq = 0.0f;
  if (epilogue_lane) {
    float s0 = acc0, s1 = acc1;
    if (a.in_sumsq != nullptr) {
      const float inv = rsqrtf(in_sumsq / a.k + a.eps);
      s0 *= inv, s1 *= inv;
    }
    if (a.swiglu_out != nullptr) {
      a.swiglu_out[pair] = __float2half(Silu(s0) * s1);
    } else {
      if (a.bias != nullptr) s0 += bias0, s1 += bias1;
      if (a.beta != 0.0f) s0 += a.beta * y0, s1 += a.beta * y1;
      if (rope) {  // the angle in fp32, as transformers computes it
        float sn, cs;
        sincosf(IntToFloat(rope_pos) * freq, &sn, &cs);
        const float r0 = s0 * cs - s1 * sn, r1 = s1 * cs + s0 * sn;
        s0 = r0, s1 = r1;
      }
      a.y[c0] = s0;
      if (has1) a.y[c1] = s1;
      sq = s0 * s0 + (has1 ? s1 * s1 : 0.0f);
    }
  }
  if (a.out_sumsq == nullptr) return;
  // One atomic per block: lane 0 of each warp holds its columns' squares (0 off slice 0).
  if (lane == 0) sumsq_s[warp] = sq;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += sumsq_s[w];
    atomicAdd(a.out_sumsq, t);
  }
}

template <int KS, bool kPreload>
__global__ void __launch_bounds__(kWarps * 32) GemvKernel(GemvArgs a, int preload) {
  GemvBody<KS, kPreload, false>(a, preload);
}
template <int KS, bool kPreload>
__global__ void __launch_bounds__(kWarps * 32, kDeepCtasPerSm) GemvDeepKernel(GemvArgs a, int preload) {
  GemvBody<KS, kPreload, true>(a, preload);
}

int Blocks(int pairs, int ks) { return (pairs + kWarps / ks - 1) / (kWarps / ks); }

template <int KS>
cudaError_t LaunchSplit(const GemvArgs& a, bool deep, int blocks, int preload, size_t smem, cudaStream_t stream) {
  void (*kernel)(GemvArgs, int) = deep ? (preload > 0 ? GemvDeepKernel<KS, true> : GemvDeepKernel<KS, false>)
                                       : (preload > 0 ? GemvKernel<KS, true> : GemvKernel<KS, false>);
  return LaunchMaybeOverlapped(a.overlap_previous, blocks, dim3(kWarps * 32), smem, stream, kernel, a, preload);
}

// The deep instances' wave (CTAs the GPU holds at once without shared memory).
absl::StatusOr<int> GemvDeepWave() {
  static PerDeviceInt waves;
  return waves.Get([]() -> absl::StatusOr<int> {
    int device = 0, sms = 0, per_sm = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    TAILSERVE_CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, GemvDeepKernel<2, false>, kWarps * 32, 0));
    return std::max(1, sms * per_sm);
  });
}

}  // namespace

absl::StatusOr<int> GemvWave() {
  static PerDeviceInt waves;
  return waves.Get([]() -> absl::StatusOr<int> {
    int device = 0, sms = 0, per_sm = 0, smem_per_sm = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    TAILSERVE_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    // Rounded down: the driver rounds a preference up to a configuration the SM has (57% of 228
    // KB on the H100/H200 becomes 132 KB).
    const int carveout = std::clamp(100 * kPreloadConfigBytes / std::max(smem_per_sm, 1), 0, 100);
    for (auto kernel : {GemvKernel<1, true>, GemvKernel<2, true>, GemvKernel<4, true>, GemvKernel<8, true>,
                        GemvDeepKernel<1, true>, GemvDeepKernel<2, true>, GemvDeepKernel<4, true>,
                        GemvDeepKernel<8, true>}) {
      TAILSERVE_CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
    }
    TAILSERVE_CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, GemvKernel<2, false>, kWarps * 32, 0));
    // The deep instances' too, so that it is known before any graph capture.
    if (absl::StatusOr<int> deep = GemvDeepWave(); !deep.ok()) return deep.status();
    return std::max(1, sms * per_sm);
  });
}

absl::Status Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.k % 8 != 0 || (a.x == nullptr) == (a.x_f32 == nullptr) || (a.y == nullptr) == (a.swiglu_out == nullptr) ||
      (a.swiglu_out != nullptr && a.n % 2 != 0) || a.k_split < 0 || a.k_split > kWarps ||
      (a.k_split & (a.k_split - 1)) != 0) {
    return absl::InvalidArgumentError(
        "Gemv: k a multiple of 8, one input, one output (SwiGLU: n even), k_split 0, 1, 2, 4 or 8");
  }
  if (a.rope_head_dim > 0 &&
      (a.rope_head_dim % 2 != 0 || a.n % a.rope_head_dim != 0 || a.rope_cols % a.rope_head_dim != 0 ||
       a.rope_cols > a.n || a.y == nullptr || a.rope_pos == nullptr || a.rope_inv_freq == nullptr)) {
    return absl::InvalidArgumentError(
        "Gemv: RoPE needs y, an even head_dim dividing n and rope_cols <= n, a position and frequencies");
  }
  // The k split: the largest whose grid fits in one wave of resident CTAs (every CTA streams from
  // the start, no tail wave), or where even no split overflows a wave, the finest (a short tail)
  // that still leaves each lane two steps of W loads. On the 8B shape that is 2 for q/k/v, o and
  // down, 8 for gate/up: 4.42 → 4.23 ms a step. The 1B's k = 2048 takes 4 for gate/up and the LM
  // head, where 8 left a lane one step (docs/cuda-decode.md). Every split forced on every 8B
  // projection (`tailserve-bench-kernels --gemv-splits`, 12-03): this one is the fastest.
  absl::StatusOr<int> wave = GemvWave();
  if (!wave.ok()) return wave.status();
  const int pairs = (a.n + 1) / 2, vecs = a.k / 8;
  int ks = 1;
  for (int k = 2; k <= kWarps && vecs >= 64 * k; k *= 2) {
    if (Blocks(pairs, k) <= *wave || Blocks(pairs, 1) > *wave) ks = k;
  }
  if (a.k_split > 0) ks = a.k_split;
  const int blocks = Blocks(pairs, ks);
  const int steps = (vecs + 32 * ks - 1) / (32 * ks);  // W loads a lane makes
  const int preload = a.preload_w ? std::min(steps, kMaxPreloadBytes / kPreloadStepBytes) : 0;
  const size_t smem = static_cast<size_t>(preload) * kPreloadStepBytes;
  // Deep where the grid fits the deep instances' wave anyway and a lane has a batch to stream.
  absl::StatusOr<int> deep_wave = GemvDeepWave();
  if (!deep_wave.ok()) return deep_wave.status();
  const bool deep = blocks <= *deep_wave && steps - preload >= kDeepSteps;
  cudaError_t launched;
  switch (ks) {
    case 1: launched = LaunchSplit<1>(a, deep, blocks, preload, smem, stream); break;
    case 2: launched = LaunchSplit<2>(a, deep, blocks, preload, smem, stream); break;
    case 4: launched = LaunchSplit<4>(a, deep, blocks, preload, smem, stream); break;
    default: launched = LaunchSplit<8>(a, deep, blocks, preload, smem, stream); break;
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(launched);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
