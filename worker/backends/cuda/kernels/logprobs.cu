#include "worker/backends/cuda/kernels/logprobs.h"

#include <cstdint>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTop = kMaxLogprobAlternatives;

// The order of the alternatives: larger logit first, lower id on ties.
__device__ __forceinline__ bool Before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

__global__ void __launch_bounds__(kThreads) LogprobKernel(const float* logits, int vocab, const SampleParams* params,
                                                          const int32_t* sampled, RowLogprobs* out) {
  const int row = blockIdx.x;
  const int want = params[row].logprobs;
  if (want <= 0) return;
  const int top = min(want - 1, kTop);
  const float* l = logits + static_cast<int64_t>(row) * vocab;
  __shared__ float shared[32];
  __shared__ float win_v[kThreads / 32];
  __shared__ int win_i[kThreads / 32];

  // One pass: an online max and sum of exp for the log-sum-exp, and each thread's best kTop in
  // registers (kept sorted by a fully unrolled insertion, so the arrays never leave registers).
  float tv[kTop];
  int ti[kTop];
#pragma unroll
  for (int k = 0; k < kTop; ++k) tv[k] = -INFINITY, ti[k] = vocab;
  float m = -INFINITY, s = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    float v = l[i];
    if (!isfinite(v)) continue;  // probability 0; NaN never listed
    if (v > m) s = s * expf(m - v) + 1.0f, m = v;
    else s += expf(v - m);
    if (top > 0 && Before(v, i, tv[kTop - 1], ti[kTop - 1])) {
      int id = i;
#pragma unroll
      for (int k = 0; k < kTop; ++k) {
        if (Before(v, id, tv[k], ti[k])) {
          const float sv = tv[k];
          const int si = ti[k];
          tv[k] = v, ti[k] = id, v = sv, id = si;
        }
      }
    }
  }
  const float block_max = BlockMax(m, shared);
  const float scaled = m == -INFINITY ? 0.0f : s * expf(m - block_max);
  const float lse = block_max + logf(BlockSum(scaled, shared));
  if (threadIdx.x == 0) {
    const int token = sampled[row];
    const float v = token >= 0 && token < vocab ? l[token] : -INFINITY;
    out[row].logprob = isfinite(v) ? v - lse : -INFINITY;
  }

  // The alternatives: `top` rounds, each taking the best head of the threads' sorted lists.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int listed = 0;  // a row with fewer finite logits than `top` lists only those
  for (int r = 0; r < top; ++r) {
    float bv = tv[0];
    int bi = ti[0];
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (Before(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) win_v[warp] = bv, win_i[warp] = bi;
    __syncthreads();
    bv = win_v[0], bi = win_i[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) {
      if (Before(win_v[w], win_i[w], bv, bi)) bv = win_v[w], bi = win_i[w];
    }
    __syncthreads();  // every thread has read the winners before the next round writes them
    if (bi >= vocab) break;  // uniform: every thread read the same winner
    if (threadIdx.x == 0) out[row].ids[r] = bi, out[row].values[r] = bv - lse;
    ++listed;
    if (ti[0] == bi) {  // ids are unique: only the owner pops its head
#pragma unroll
      for (int k = 0; k + 1 < kTop; ++k) tv[k] = tv[k + 1], ti[k] = ti[k + 1];
      tv[kTop - 1] = -INFINITY, ti[kTop - 1] = vocab;
    }
  }
  if (threadIdx.x == 0) out[row].count = listed;
}

}  // namespace

absl::Status LogprobRows(const float* logits, int rows, int vocab, const SampleParams* params, const int32_t* sampled,
                         RowLogprobs* out, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  LogprobKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, params, sampled, out);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
