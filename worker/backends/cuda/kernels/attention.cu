#include "worker/backends/cuda/kernels/attention.h"

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/kv_codec.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 128;       // keys scored per pass (one per thread)
constexpr int kMaxGroup = 16;    // query heads per KV head
constexpr int kMaxHeadDim = 256;
constexpr int kMaxPairs = kMaxGroup * kMaxHeadDim / kThreads;  // (group, dim) outputs per thread

template <KvDtype D>
__global__ void __launch_bounds__(kThreads) AttentionSplitKernel(const float* q, AttentionShape shape, RowMeta meta,
                                                                 KvGeometry g, KvLayerView layer, float* partial) {
  using Codec = KvCodec<D>;
  using Storage = typename Codec::Storage;
  const int row = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int hd = g.head_dim, group = shape.heads / g.kv_heads, kvh = g.kv_heads;
  const int pos = meta.pos[row];
  const int lo = shape.sliding_window > 0 ? max(0, pos - shape.sliding_window + 1) : 0;
  const int n = pos + 1 - lo;
  // Split the row's key range evenly, in multiples of 32 keys.
  const int chunk = ((n + shape.splits - 1) / shape.splits + 31) & ~31;
  const int begin = lo + split * chunk, end = min(pos + 1, begin + chunk);
  const int pairs = group * hd;
  float* out = partial + ((static_cast<int64_t>(row) * shape.heads + kv_head * group) * shape.splits + split) * (hd + 2);
  // Partial layout per (row, head, split): acc[hd], max, sum.
  auto out_at = [&](int gi) { return out + static_cast<int64_t>(gi) * shape.splits * (hd + 2); };
  if (begin >= end) {
    for (int i = threadIdx.x; i < pairs; i += kThreads) out_at(i / hd)[i % hd] = 0.0f;
    if (threadIdx.x < group) out_at(threadIdx.x)[hd] = -INFINITY, out_at(threadIdx.x)[hd + 1] = 0.0f;
    return;
  }

  __shared__ float q_s[kMaxGroup * kMaxHeadDim];
  __shared__ float p_s[kMaxGroup][kTile];
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], corr_s[kMaxGroup];
  const float* qrow = q + static_cast<int64_t>(row) * shape.q_stride + kv_head * group * hd;
  for (int i = threadIdx.x; i < pairs; i += kThreads) q_s[i] = qrow[i] * shape.scale;
  if (threadIdx.x < group) m_s[threadIdx.x] = -INFINITY, l_s[threadIdx.x] = 0.0f;
  float acc[kMaxPairs];
#pragma unroll
  for (int j = 0; j < kMaxPairs; ++j) acc[j] = 0.0f;
  const int32_t* blocks = meta.block_table + static_cast<int64_t>(meta.seq[row]) * g.max_blocks_per_seq;
  auto slot_of = [&](int p) { return static_cast<int64_t>(blocks[p / g.block_size]) * g.block_size + p % g.block_size; };
  __syncthreads();

  for (int t0 = begin; t0 < end; t0 += kTile) {
    const int tn = min(kTile, end - t0);
    // Scores: thread i scores key t0 + i against every query head of the group.
    if (threadIdx.x < tn) {
      const int64_t slot = slot_of(t0 + threadIdx.x);
      const Storage* k = static_cast<const Storage*>(layer.k) + (slot * kvh + kv_head) * hd;
      const float ks = Codec::kScaled ? layer.k_scale[slot * kvh + kv_head] : 1.0f;
      float dot[kMaxGroup];
#pragma unroll
      for (int gi = 0; gi < kMaxGroup; ++gi) dot[gi] = 0.0f;
      for (int d = 0; d < hd; ++d) {
        const float kd = Codec::Decode(k[d]);
#pragma unroll
        for (int gi = 0; gi < kMaxGroup; ++gi) {
          if (gi < group) dot[gi] += kd * q_s[gi * hd + d];
        }
      }
#pragma unroll
      for (int gi = 0; gi < kMaxGroup; ++gi) {
        if (gi < group) p_s[gi][threadIdx.x] = dot[gi] * ks;
      }
    }
    __syncthreads();
    // Online softmax: one warp per query head updates its running max and sum.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int gi = warp; gi < group; gi += kThreads / 32) {
      float tmax = -INFINITY;
      for (int j = lane; j < tn; j += 32) tmax = fmaxf(tmax, p_s[gi][j]);
      tmax = WarpMax(tmax);
      const float m_new = fmaxf(m_s[gi], tmax);
      float tsum = 0.0f;
      for (int j = lane; j < tn; j += 32) {
        const float e = expf(p_s[gi][j] - m_new);
        p_s[gi][j] = e;
        tsum += e;
      }
      tsum = WarpSum(tsum);
      if (lane == 0) {
        const float corr = expf(m_s[gi] - m_new);  // 0 on the first tile (m_s = -inf)
        corr_s[gi] = corr;
        l_s[gi] = l_s[gi] * corr + tsum;
        m_s[gi] = m_new;
      }
    }
    __syncthreads();
    // Values: thread owns outputs (gi, d) = i, i + 128, ...; V rows are read coalesced.
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i >= pairs) break;
      const int gi = i / hd, d = i % hd;
      float a = acc[j] * corr_s[gi];
      for (int t = 0; t < tn; ++t) {
        const int64_t slot = slot_of(t0 + t);
        const Storage* v = static_cast<const Storage*>(layer.v) + (slot * kvh + kv_head) * hd;
        const float vs = Codec::kScaled ? layer.v_scale[slot * kvh + kv_head] : 1.0f;
        a += p_s[gi][t] * Codec::Decode(v[d]) * vs;
      }
      acc[j] = a;
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kMaxPairs; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i >= pairs) break;
    out_at(i / hd)[i % hd] = acc[j];
  }
  if (threadIdx.x < group) out_at(threadIdx.x)[hd] = m_s[threadIdx.x], out_at(threadIdx.x)[hd + 1] = l_s[threadIdx.x];
}

// Merges the splits of one (row, head): out = Σ acc_s e^(m_s − M) / Σ l_s e^(m_s − M).
__global__ void AttentionCombineKernel(const float* partial, int heads, int splits, int hd, __nv_bfloat16* out) {
  const int row = blockIdx.x, head = blockIdx.y;
  const float* p = partial + (static_cast<int64_t>(row) * heads + head) * splits * (hd + 2);
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, p[s * (hd + 2) + hd]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float ms = p[s * (hd + 2) + hd];
    if (ms != -INFINITY) l += p[s * (hd + 2) + hd + 1] * expf(ms - m);
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = p[s * (hd + 2) + hd];
      if (ms != -INFINITY) a += p[s * (hd + 2) + d] * expf(ms - m);
    }
    out[(static_cast<int64_t>(row) * heads + head) * hd + d] = __float2bfloat16(a / l);
  }
}

}  // namespace

size_t AttentionWorkspaceFloats(const AttentionShape& s, int head_dim) {
  return static_cast<size_t>(s.rows) * s.heads * s.splits * (head_dim + 2);
}

absl::Status PagedAttention(const float* q, const AttentionShape& shape, const RowMeta& meta, const KvGeometry& g,
                            const KvLayerView& layer, float* workspace, __nv_bfloat16* out, cudaStream_t stream) {
  const int group = shape.heads / g.kv_heads;
  if (group > kMaxGroup || g.head_dim > kMaxHeadDim || group * g.head_dim > kMaxPairs * kThreads) {
    return absl::InvalidArgumentError("PagedAttention: at most 16 query heads per KV head and head_dim 256");
  }
  if (shape.rows == 0) return absl::OkStatus();
  const dim3 grid(shape.rows, g.kv_heads, shape.splits);
  switch (g.dtype) {
    case KvDtype::kFp8E4M3:
      AttentionSplitKernel<KvDtype::kFp8E4M3><<<grid, kThreads, 0, stream>>>(q, shape, meta, g, layer, workspace);
      break;
    case KvDtype::kFp8E5M2:
      AttentionSplitKernel<KvDtype::kFp8E5M2><<<grid, kThreads, 0, stream>>>(q, shape, meta, g, layer, workspace);
      break;
    case KvDtype::kFp16:
      AttentionSplitKernel<KvDtype::kFp16><<<grid, kThreads, 0, stream>>>(q, shape, meta, g, layer, workspace);
      break;
  }
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  AttentionCombineKernel<<<dim3(shape.rows, shape.heads), 128, 0, stream>>>(workspace, shape.heads, shape.splits,
                                                                            g.head_dim, out);
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
