#include "worker/backends/cuda/kernels/sampling.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "common/splitmix.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kBisections = 40;
constexpr int kMaxScanCtas = 8;  // a portable cluster
static_assert(kThreads == 32 * 32 && kMaxScanCtas <= 32, "one warp merges the CTA's warps and the cluster's ranks");

// Sum over the row of exp(s - max) for scaled logits s >= threshold, and their count.
__device__ void MassAbove(const float* l, int vocab, float inv_t, float max, float threshold, float* shared,
                          float* mass, float* count) {
  float m = 0.0f, c = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float s = l[i] * inv_t;
    if (s >= threshold) m += expf(s - max), c += 1.0f;
  }
  *mass = BlockSum(m, shared);
  *count = BlockSum(c, shared);
}

__global__ void __launch_bounds__(kThreads, 1) SampleKernel(const float* logits, int vocab, const SampleParams* params,
                                                          int32_t* out) {
  __shared__ float shared[32];
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  __shared__ double scan[kThreads];
  __shared__ float rank_v[kMaxScanCtas];  // rank 0's: each rank's best
  __shared__ int rank_i[kMaxScanCtas];
  const int row = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rank = blockIdx.z, ranks = gridDim.z;  // the row's scan is split over a cluster along z
  const float* l = logits + static_cast<int64_t>(row) * vocab;
  // A rank writes into rank 0's shared memory only once every CTA of the cluster has started: the
  // barrier's arrival goes out now and its wait, after the scan, finds it complete.
  if (ranks > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  // Launched programmatically (SampleRows' overlap_previous) the CTAs take SMs as the LM head
  // drains and wait here for its logits.
  GridDependencyWait();
  const SampleParams p = params[row];

  // Greedy (and the fallback): the largest logit, lowest index on ties. Each thread visits its
  // indices in increasing order, so `>` keeps its lowest; NaN never wins. 16-byte loads, 8 in
  // flight a thread (64 registers: hence the launch bounds' 1): the graph-profiled sample op of
  // the 8B batch-1 step (128K logits from L2) went 14.8 → 10.5 µs from scalar loads. One SM
  // still reads the row at ~50 GB/s, so a cluster of CTAs (SampleRows picks how many) scans
  // contiguous parts of it and rank 0 merges their bests through distributed shared memory.
  float bv = -INFINITY;
  int bi = vocab;
  const bool vectors = (reinterpret_cast<uintptr_t>(l) & 15) == 0;
  const int n4 = vectors ? vocab / 4 : 0, per4 = (n4 + ranks - 1) / ranks;
  const int lo4 = min(n4, rank * per4), hi4 = min(n4, lo4 + per4);
  const int tail = vocab - 4 * n4, per_tail = (tail + ranks - 1) / ranks;  // scalars past the vectors
  const int scalar_from = 4 * n4 + min(tail, rank * per_tail), scalar_to = min(vocab, scalar_from + per_tail);
  {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    auto take = [&](const float4& v, int j) {
      if (v.x > bv) bv = v.x, bi = 4 * j;
      if (v.y > bv) bv = v.y, bi = 4 * j + 1;
      if (v.z > bv) bv = v.z, bi = 4 * j + 2;
      if (v.w > bv) bv = v.w, bi = 4 * j + 3;
    };
    // Guarded rather than a batched loop and a one-at-a-time tail: a CTA's share of the 8B's row
    // at batch 1 is ~4 vectors a thread, which the tail loop fetched one L2 round trip at a time.
    constexpr int kInFlight = 8;
    for (int j = lo4 + threadIdx.x; j < hi4; j += kInFlight * kThreads) {
      float4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (j + u * kThreads < hi4) v[u] = l4[j + u * kThreads];
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (j + u * kThreads < hi4) take(v[u], j + u * kThreads);
      }
    }
  }
  for (int i = scalar_from + threadIdx.x; i < scalar_to; i += kThreads) {
    if (l[i] > bv) bv = l[i], bi = i;
  }
  auto warp_best = [&]() {
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
  };
  warp_best();
  if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
  __syncthreads();
  if (warp == 0) {  // the 32 warps' bests, merged by one warp's shuffles
    bv = best_v[lane], bi = best_i[lane];
    warp_best();
  }
  if (ranks > 1) {
    // Every rank writes its best into rank 0's slot `rank` (distributed shared memory); one
    // cluster barrier (release / acquire) publishes them, and rank 0 merges them with a warp.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (threadIdx.x == 0) {
      *cluster.map_shared_rank(&rank_v[rank], 0) = bv;
      *cluster.map_shared_rank(&rank_i[rank], 0) = bi;
    }
    cluster.sync();
    if (rank != 0) return;
    if (warp == 0) {
      bv = lane < ranks ? rank_v[lane] : -INFINITY, bi = lane < ranks ? rank_i[lane] : vocab;
      warp_best();
    }
  }
  if (threadIdx.x == 0) best_v[0] = bv, best_i[0] = bi;
  __syncthreads();
  const int argmax = best_i[0] < vocab ? best_i[0] : 0;
  if (p.temperature <= 0.0f || p.top_k == 1) {
    if (threadIdx.x == 0) out[row] = argmax;
    return;
  }

  const float inv_t = 1.0f / p.temperature;
  const float smax = best_v[0] * inv_t;
  float lo_min = INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) lo_min = fminf(lo_min, l[i] * inv_t);
  lo_min = -BlockMax(-lo_min, shared);

  // top-k: the largest threshold that keeps at least k logits.
  float threshold = lo_min, mass, count;
  if (p.top_k > 0 && p.top_k < vocab) {
    float lo = lo_min, hi = smax;
    for (int it = 0; it < kBisections; ++it) {
      const float mid = 0.5f * (lo + hi);
      MassAbove(l, vocab, inv_t, smax, mid, shared, &mass, &count);
      if (count >= p.top_k) lo = mid; else hi = mid;
    }
    threshold = lo;
  }
  MassAbove(l, vocab, inv_t, smax, threshold, shared, &mass, &count);
  // top-p: the largest threshold whose kept mass is still at least top_p of the top-k mass.
  if (p.top_p < 1.0f) {
    const float target = p.top_p * mass;
    float lo = threshold, hi = smax, m_hi, c_hi;
    MassAbove(l, vocab, inv_t, smax, hi, shared, &m_hi, &c_hi);
    if (m_hi >= target) {
      lo = hi;
    } else {
      for (int it = 0; it < kBisections; ++it) {
        const float mid = 0.5f * (lo + hi);
        MassAbove(l, vocab, inv_t, smax, mid, shared, &m_hi, &c_hi);
        if (m_hi >= target) lo = mid; else hi = mid;
      }
    }
    threshold = lo;
    MassAbove(l, vocab, inv_t, smax, threshold, shared, &mass, &count);
  }

  // Inverse CDF in index order: each thread owns a contiguous chunk; an exclusive scan of the
  // chunk sums finds the chunk holding u, whose owner walks it.
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = threadIdx.x * chunk, end = min(vocab, begin + chunk);
  double local = 0.0;
  for (int i = begin; i < end; ++i) {
    const float s = l[i] * inv_t;
    if (s >= threshold) local += expf(s - smax);
  }
  scan[threadIdx.x] = local;
  __shared__ double total_s;
  __shared__ int chosen;
  __syncthreads();
  if (threadIdx.x == 0) {  // 1024 adds: cheap next to the bisections
    double acc = 0.0;
    for (int t = 0; t < kThreads; ++t) {
      const double v = scan[t];
      scan[t] = acc;
      acc += v;
    }
    total_s = acc;
    chosen = -1;
  }
  __syncthreads();
  const double u = SampleUniform(p.seed, p.position) * total_s;
  if (local > 0.0 && u >= scan[threadIdx.x] && u < scan[threadIdx.x] + local) {
    double acc = scan[threadIdx.x];
    int pick = -1;
    for (int i = begin; i < end; ++i) {
      const float s = l[i] * inv_t;
      if (s < threshold) continue;
      pick = i;  // rounding can leave u past the last kept element: keep that one
      acc += expf(s - smax);
      if (u < acc) break;
    }
    chosen = pick;
  }
  __syncthreads();
  if (threadIdx.x == 0) out[row] = chosen >= 0 ? chosen : argmax;
}

}  // namespace

absl::Status SampleRows(const float* logits, int rows, int vocab, const SampleParams* params, int32_t* out,
                        cudaStream_t stream, bool overlap_previous) {
  if (rows == 0) return absl::OkStatus();
  // A CTA takes a whole SM (1024 threads × 64 registers): split each row's scan over as many CTAs
  // as fit in half the SMs (a cluster must find its CTAs free SMs in one GPC), at most 8.
  int device = 0, sms = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int ctas = std::clamp(sms / (2 * rows), 1, kMaxScanCtas);
  TAILSERVE_CUDA_RETURN_IF_ERROR(LaunchMaybeOverlappedInClusters(overlap_previous, ctas, dim3(rows, 1, ctas),
                                                                 dim3(kThreads), 0, stream, SampleKernel, logits, vocab,
                                                                 params, out));
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
