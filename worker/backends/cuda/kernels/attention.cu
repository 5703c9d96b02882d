#include "worker/backends/cuda/kernels/attention.h"

#include <type_traits>

#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/attention_mma.cuh"
#include "worker/backends/cuda/kernels/common.cuh"
#include "worker/backends/cuda/kernels/kv_codec.cuh"

namespace tailserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 128;      // keys per softmax pass
constexpr int kMaxGroup = 8;    // query heads per KV head
constexpr int kMaxHeadDim = 256;
constexpr int kInFlight = 4;    // 16-byte loads each thread issues before using any

// Threads cooperate on each cache row VB bytes at a time: a key's head_dim elements are spread
// over `tpk` threads (chunk c holds elements [c·ept, (c+1)·ept)), so every load is a coalesced
// vector and a warp covers 32 / tpk keys at once. Both phases (scores Q·K, then P·V) use this
// layout, and each thread keeps kInFlight loads outstanding before it computes. A thread only ever
// needs its chunk of each query head, so q lives in registers (read from shared memory it cost 4-way
// bank conflicts on every key: ncu, v5), next to the accumulator of the same chunk.
// G: query heads per KV head, a template parameter so the per-head arrays stay in registers sized
// to the model. VB: bytes per load (VectorBytes).
template <KvDtype D, int G, int VB>
__global__ void __launch_bounds__(kThreads) AttentionSplitKernel(const float* q, AttentionShape shape, RowMeta meta,
                                                                 KvGeometry g, KvLayerView layer, float* partial) {
  using Codec = KvCodec<D>;
  using Storage = typename Codec::Storage;
  using Vec = std::conditional_t<VB == 16, uint4, uint2>;
  constexpr int ept = VB / sizeof(Storage);  // elements per thread per key
  constexpr int group = G;
  const int row = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int hd = g.head_dim, kvh = g.kv_heads;
  const int tpk = hd / ept, kpp = kThreads / tpk;  // threads per key, keys per pass
  const int c = threadIdx.x % tpk, kl = threadIdx.x / tpk;
  const int pos = meta.pos[row];
  const int lo = shape.sliding_window > 0 ? max(0, pos - shape.sliding_window + 1) : 0;
  const int n = pos + 1 - lo;
  // Split the row's key range evenly, in multiples of 32 keys.
  const int chunk = ((n + shape.splits - 1) / shape.splits + 31) & ~31;
  const int begin = lo + split * chunk, end = min(pos + 1, begin + chunk);
  // Partial layout per (row, head, split): acc[hd], max, sum.
  float* out = partial + ((static_cast<int64_t>(row) * shape.heads + kv_head * group) * shape.splits + split) * (hd + 2);
  auto out_at = [&](int gi) { return out + static_cast<int64_t>(gi) * shape.splits * (hd + 2); };
  if (begin >= end) {
    for (int i = threadIdx.x; i < group * hd; i += kThreads) out_at(i / hd)[i % hd] = 0.0f;
    if (threadIdx.x < group) out_at(threadIdx.x)[hd] = -INFINITY, out_at(threadIdx.x)[hd + 1] = 0.0f;
    return;
  }

  __shared__ float red_s[G * kMaxHeadDim];  // the final sum over key lanes
  __shared__ float p_s[G][kTile];
  __shared__ int64_t slot_s[kTile];
  __shared__ float kscale_s[kTile], vscale_s[kTile];
  __shared__ float m_s[G], l_s[G], corr_s[G];
  const float* qrow = q + static_cast<int64_t>(row) * shape.q_stride + kv_head * group * hd + c * ept;
  float qr[G][ept], acc[G][ept];
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
#pragma unroll
    for (int e = 0; e < ept; ++e) qr[gi][e] = qrow[gi * hd + e] * shape.scale, acc[gi][e] = 0.0f;
  }
  if (threadIdx.x < group) m_s[threadIdx.x] = -INFINITY, l_s[threadIdx.x] = 0.0f;
  const int32_t* blocks = BlockTableRow(meta, g, row);
  const Storage* kbase = static_cast<const Storage*>(layer.k) + kv_head * hd + c * ept;
  const Storage* vbase = static_cast<const Storage*>(layer.v) + kv_head * hd + c * ept;
  const int64_t row_stride = static_cast<int64_t>(kvh) * hd;  // elements between cache slots

  for (int t0 = begin; t0 < end; t0 += kTile) {
    const int tn = min(kTile, end - t0);
    __syncthreads();  // the previous tile's p_s / slot_s are consumed
    for (int j = threadIdx.x; j < tn; j += kThreads) {
      const int p = t0 + j;
      const int64_t slot = CacheSlot(blocks, g.block_size, p);
      slot_s[j] = slot;
      kscale_s[j] = Codec::kScaled ? layer.k_scale[slot * kvh + kv_head] : 1.0f;
      vscale_s[j] = Codec::kScaled ? layer.v_scale[slot * kvh + kv_head] : 1.0f;
    }
    __syncthreads();
    // Scores.
    for (int j0 = 0; j0 < tn; j0 += kpp * kInFlight) {
      Vec raw[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = j0 + u * kpp + kl;
        if (j < tn) raw[u] = *reinterpret_cast<const Vec*>(kbase + slot_s[j] * row_stride);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = j0 + u * kpp + kl;
        const Storage* e = reinterpret_cast<const Storage*>(&raw[u]);
        float dot[G];
#pragma unroll
        for (int gi = 0; gi < G; ++gi) dot[gi] = 0.0f;
        if (j < tn) {
#pragma unroll
          for (int x = 0; x < ept; ++x) {
            const float kd = Codec::Decode(e[x]);
#pragma unroll
            for (int gi = 0; gi < G; ++gi) dot[gi] += kd * qr[gi][x];
          }
        }
        // Sum the key's tpk partial dots (consecutive lanes of one warp).
#pragma unroll
        for (int gi = 0; gi < G; ++gi) {
          for (int o = tpk / 2; o > 0; o >>= 1) dot[gi] += __shfl_xor_sync(0xffffffffu, dot[gi], o);
        }
        if (c == 0 && j < tn) {
#pragma unroll
          for (int gi = 0; gi < G; ++gi) p_s[gi][j] = dot[gi] * kscale_s[j];
        }
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
        tsum += e;
        p_s[gi][j] = e * vscale_s[j];  // the V scale folds into the weight
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
#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
#pragma unroll
      for (int e = 0; e < ept; ++e) acc[gi][e] *= corr_s[gi];
    }
    // Values: thread (kl, c) adds keys kl, kl + kpp, ... for its chunk of dimensions.
    for (int j0 = 0; j0 < tn; j0 += kpp * kInFlight) {
      Vec raw[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = j0 + u * kpp + kl;
        if (j < tn) raw[u] = *reinterpret_cast<const Vec*>(vbase + slot_s[j] * row_stride);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = j0 + u * kpp + kl;
        if (j >= tn) continue;
        const Storage* e = reinterpret_cast<const Storage*>(&raw[u]);
        float pw[G];
#pragma unroll
        for (int gi = 0; gi < G; ++gi) pw[gi] = p_s[gi][j];
#pragma unroll
        for (int x = 0; x < ept; ++x) {
          const float vd = Codec::Decode(e[x]);
#pragma unroll
          for (int gi = 0; gi < G; ++gi) acc[gi][x] += pw[gi] * vd;
        }
      }
    }
  }
  // Sum over the key lanes: first within each warp (lanes c, c + tpk, ...), then the 4 warps
  // through shared memory.
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
#pragma unroll
    for (int e = 0; e < ept; ++e) {
      for (int o = tpk; o < 32; o <<= 1) acc[gi][e] += __shfl_xor_sync(0xffffffffu, acc[gi][e], o);
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (warp == w && lane < tpk) {
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
#pragma unroll
        for (int e = 0; e < ept; ++e) {
          float& r = red_s[gi * hd + c * ept + e];
          r = (w == 0 ? 0.0f : r) + acc[gi][e];
        }
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < group * hd; i += kThreads) out_at(i / hd)[i % hd] = red_s[i];
  if (threadIdx.x < group) out_at(threadIdx.x)[hd] = m_s[threadIdx.x], out_at(threadIdx.x)[hd + 1] = l_s[threadIdx.x];
}

// Merges the splits of one (row, head): out = Σ acc_s e^(m_s − M) / Σ l_s e^(m_s − M).
// It triggers its follower before its own wait (as do a cluster-merged attention's empty splits,
// which never wait): it does nothing before the wait,
// and its follower (the batch-1 o Gemv) reads only weights before its own, so the o Gemv's CTAs
// copy W into shared memory while the attention runs (DRAM is idle then at batch 1).
__global__ void AttentionCombineKernel(const float* partial, int heads, int splits, int hd, __half* out) {
  TriggerDependents();
  GridDependencyWait();
  const int row = blockIdx.x, head = blockIdx.y, stride = hd + 2;
  const float* p = partial + (static_cast<int64_t>(row) * heads + head) * splits * stride;
  // kCombineBatch splits' max, sum and value are loaded at once and merged online (running max),
  // so the kernel waits on L2 once per batch: three dependent passes (max, sum, values) took ~3.5 µs
  // a layer at batch 1 on the 8B shape (per-CTA timeline).
  constexpr int kCombineBatch = 16;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float m = -INFINITY, l = 0.0f, a = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += kCombineBatch) {
      float ms[kCombineBatch], ls[kCombineBatch], as[kCombineBatch];
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        const bool in = s0 + i < splits;
        const float* split = p + static_cast<int64_t>(s0 + i) * stride;
        ms[i] = in ? split[hd] : -INFINITY;
        ls[i] = in ? split[hd + 1] : 0.0f;
        as[i] = in ? split[d] : 0.0f;
      }
      float mb = m;
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) mb = fmaxf(mb, ms[i]);
      if (mb == -INFINITY) continue;  // no keys in any split so far
      const float c = expf(m - mb);  // 0 while m is -inf
      l *= c, a *= c;
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        const float e = ms[i] == -INFINITY ? 0.0f : expf(ms[i] - mb);
        l += ls[i] * e, a += as[i] * e;
      }
      m = mb;
    }
    out[(static_cast<int64_t>(row) * heads + head) * hd + d] = __float2half(a / l);
  }
}

// Bytes each thread loads per key: FP8 with more than 2 query heads per KV head takes 8, so q and
// acc stay at 32 registers each (measured, 1B shape, FP8, 4 heads per KV head: 16-byte vectors
// needed 218 registers, 2 CTAs/SM, and made batch-64 attention 1.8x slower than 8-byte ones at
// 118 registers). fp16 keeps 16-byte vectors (8 elements) so head_dim 256 fits 32 lanes.
constexpr int VectorBytes(KvDtype d, int group) { return d != KvDtype::kFp16 && group > 2 ? 8 : 16; }

// FP8 caches at the common head sizes run on the tensor cores (attention_mma.cuh).
bool UsesMma(const KvGeometry& g) { return TensorCoreAttention(g.dtype, g.head_dim); }

// Calls f with the tensor-core kernel instance for the shape (UsesMma(g), warps as CheckShape allows).
template <typename F>
void WithMmaKernel(const AttentionShape& shape, const KvGeometry& g, F&& f) {
  using mma_attention::AttentionMmaKernel;
  auto by_dim = [&](auto dtype_tag, auto hd_tag) {
    constexpr KvDtype D = decltype(dtype_tag)::value;
    constexpr int HD = decltype(hd_tag)::value;
    if (shape.runs) f(AttentionMmaKernel<D, HD, true, 4>);
    else if (shape.warps == 16) f(AttentionMmaKernel<D, HD, false, 16>);
    else if (shape.warps == 8) f(AttentionMmaKernel<D, HD, false, 8>);
    else f(AttentionMmaKernel<D, HD, false, 4>);
  };
  auto by_dtype = [&](auto hd_tag) {
    if (g.dtype == KvDtype::kFp8E4M3) by_dim(std::integral_constant<KvDtype, KvDtype::kFp8E4M3>{}, hd_tag);
    else by_dim(std::integral_constant<KvDtype, KvDtype::kFp8E5M2>{}, hd_tag);
  };
  if (g.head_dim == 32) by_dtype(std::integral_constant<int, 32>{});
  else if (g.head_dim == 64) by_dtype(std::integral_constant<int, 64>{});
  else by_dtype(std::integral_constant<int, 128>{});
}

// Calls f with the CUDA-core kernel instance for the group size and cache dtype.
template <typename F>
void WithSplitKernel(int group, KvDtype dtype, F&& f) {
  auto by_group = [&](auto dtype_tag) {
    constexpr KvDtype D = decltype(dtype_tag)::value;
    switch (group) {
      case 1: f(AttentionSplitKernel<D, 1, VectorBytes(D, 1)>); break;
      case 2: f(AttentionSplitKernel<D, 2, VectorBytes(D, 2)>); break;
      case 3: f(AttentionSplitKernel<D, 3, VectorBytes(D, 3)>); break;
      case 4: f(AttentionSplitKernel<D, 4, VectorBytes(D, 4)>); break;
      case 5: f(AttentionSplitKernel<D, 5, VectorBytes(D, 5)>); break;
      case 6: f(AttentionSplitKernel<D, 6, VectorBytes(D, 6)>); break;
      case 7: f(AttentionSplitKernel<D, 7, VectorBytes(D, 7)>); break;
      default: f(AttentionSplitKernel<D, 8, VectorBytes(D, 8)>); break;
    }
  };
  switch (dtype) {
    case KvDtype::kFp8E4M3: by_group(std::integral_constant<KvDtype, KvDtype::kFp8E4M3>{}); break;
    case KvDtype::kFp8E5M2: by_group(std::integral_constant<KvDtype, KvDtype::kFp8E5M2>{}); break;
    case KvDtype::kFp16: by_group(std::integral_constant<KvDtype, KvDtype::kFp16>{}); break;
  }
}

absl::Status CheckShape(const AttentionShape& shape, const KvGeometry& g) {
  if (shape.warps != 4 && !(UsesMma(g) && !shape.runs && (shape.warps == 8 || shape.warps == 16))) {
    return absl::InvalidArgumentError("PagedAttention: 8 or 16 warps a CTA need the tensor-core kernel and decode rows");
  }
  const int group = shape.heads / g.kv_heads;
  const int elem = static_cast<int>(KvElementBytes(g.dtype));
  const int ept = (elem == 1 && group > 2 ? 8 : 16) / elem;  // as VectorBytes picks
  const int tpk = g.head_dim / ept;
  if (group > kMaxGroup || g.head_dim > kMaxHeadDim || g.head_dim % ept != 0 || tpk > 32 || (tpk & (tpk - 1))) {
    return absl::InvalidArgumentError("PagedAttention: at most 8 query heads per KV head; head_dim a power-of-two multiple of 16 bytes, up to 256");
  }
  return absl::OkStatus();
}

}  // namespace

bool AttentionTakesNewKv(const KvGeometry& g) { return UsesMma(g); }

int AttentionRowTiles(const AttentionShape& s, const KvGeometry& g) {
  return AttentionRowTiles(s.rows, s.heads, g.kv_heads, s.runs, UsesMma(g));
}

size_t AttentionWorkspaceFloats(const AttentionShape& s, int head_dim) {
  return static_cast<size_t>(s.rows) * s.heads * s.splits * (head_dim + 2);
}

absl::StatusOr<int> AttentionCtasPerSm(const AttentionShape& shape, const KvGeometry& g) {
  TAILSERVE_RETURN_IF_ERROR(CheckShape(shape, g));
  int blocks = 0;
  cudaError_t error = cudaSuccess;
  if (UsesMma(g)) {
    WithMmaKernel(shape, g, [&](auto kernel) {
      const int smem = mma_attention::DynamicSmemBytes(g.head_dim, shape.warps);
      error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (error == cudaSuccess) error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, shape.warps * 32, smem);
    });
  } else {
    WithSplitKernel(shape.heads / g.kv_heads, g.dtype,
                    [&](auto kernel) { error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0); });
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(error);
  return blocks;
}

absl::Status PagedAttention(const float* q, const AttentionShape& shape, const RowMeta& meta, const KvGeometry& g,
                            const KvLayerView& layer, float* workspace, __half* out, cudaStream_t stream,
                            unsigned long long* clamps) {
  TAILSERVE_RETURN_IF_ERROR(CheckShape(shape, g));
  if (shape.new_kv && (!UsesMma(g) || shape.runs || clamps == nullptr)) {
    return absl::InvalidArgumentError("PagedAttention: new_kv needs the tensor-core kernel, decode rows and a clamp counter");
  }
  if (shape.rope.inv_freq && (!shape.new_kv || shape.rope.parts.OrNone().count > kMaxPartials)) {
    return absl::InvalidArgumentError("PagedAttention: RoPE in the attention needs new_kv and at most 4 partials");
  }
  const bool cluster_merge = shape.cluster_merge;
  if (cluster_merge && (!UsesMma(g) || shape.runs || shape.splits < 2 || shape.splits > kMaxClusterSplits)) {
    return absl::InvalidArgumentError("PagedAttention: cluster_merge needs the tensor-core kernel, decode rows and 2-16 splits");
  }
  if (shape.rows == 0) return absl::OkStatus();
  if (UsesMma(g)) {
    const dim3 grid(AttentionRowTiles(shape, g), g.kv_heads, shape.splits);
    // With cluster_merge a row's splits form one cluster (more than 8 CTAs is a non-portable size).
    const unsigned cluster_z = cluster_merge ? static_cast<unsigned>(shape.splits) : 1;
    const int smem = mma_attention::DynamicSmemBytes(g.head_dim, shape.warps);
    AttentionRope rope = shape.rope;
    rope.parts = rope.parts.OrNone();
    cudaError_t launched = cudaSuccess;
    WithMmaKernel(shape, g, [&](auto kernel) {
      if (cluster_z > 8) launched = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (launched == cudaSuccess && smem > 0) {
        launched = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      }
      if (launched != cudaSuccess) return;
      launched = LaunchMaybeOverlappedInClusters(shape.overlap_previous, cluster_z, grid, dim3(shape.warps * 32),
                                                 smem, stream, kernel, q, shape.rows, shape.heads, shape.q_stride,
                                                 shape.sliding_window, shape.splits, shape.scale, meta, g, layer,
                                                 workspace, out, shape.new_kv, clamps, cluster_merge, rope);
    });
    TAILSERVE_CUDA_RETURN_IF_ERROR(launched);
  } else {
    const dim3 grid(shape.rows, g.kv_heads, shape.splits);
    WithSplitKernel(shape.heads / g.kv_heads, g.dtype,
                    [&](auto kernel) { kernel<<<grid, kThreads, 0, stream>>>(q, shape, meta, g, layer, workspace); });
  }
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  if (UsesMma(g) && (shape.splits == 1 || cluster_merge)) return absl::OkStatus();  // the kernel wrote `out` itself
  TAILSERVE_CUDA_RETURN_IF_ERROR(LaunchMaybeOverlapped(shape.overlap_previous, dim3(shape.rows, shape.heads), dim3(128), 0,
                                                       stream, AttentionCombineKernel, static_cast<const float*>(workspace),
                                                       shape.heads, shape.splits, g.head_dim, out));
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
