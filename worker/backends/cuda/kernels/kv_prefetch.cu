#include "worker/backends/cuda/kernels/kv_prefetch.h"

#include "worker/backends/cuda/cuda_check.h"
#include "worker/engine/kv_dtype.h"

namespace tailserve::cuda {
namespace {

__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes, bool evict_last) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (evict_last) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p), "r"(bytes), "l"(policy)
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
  }
#endif
}

// A warp a row, a lane a block: each lane issues its blocks' 2-4 bulk prefetches and exits.
__global__ void PrefetchKvKernel(KvPrefetch p, RowMeta meta, KvGeometry g, KvLayerView layer, uint32_t data_bytes,
                                 uint32_t scale_bytes) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= p.rows) return;
  const int blocks = min(p.max_blocks_per_row, meta.pos[row] / g.block_size + 1);
  const int32_t* table = meta.block_table + static_cast<int64_t>(meta.seq[row]) * g.max_blocks_per_seq;
  for (int i = lane; i < blocks; i += 32) {
    const int64_t block = table[i];
    PrefetchL2(static_cast<const char*>(layer.k) + block * data_bytes, data_bytes, p.evict_last);
    PrefetchL2(static_cast<const char*>(layer.v) + block * data_bytes, data_bytes, p.evict_last);
    if (scale_bytes > 0) {
      PrefetchL2(reinterpret_cast<const char*>(layer.k_scale) + block * scale_bytes, scale_bytes, p.evict_last);
      PrefetchL2(reinterpret_cast<const char*>(layer.v_scale) + block * scale_bytes, scale_bytes, p.evict_last);
    }
  }
}

}  // namespace

absl::Status PrefetchKvToL2(const KvPrefetch& p, const RowMeta& meta, const KvGeometry& g, const KvLayerView& layer,
                            cudaStream_t stream) {
  const int64_t per_block = int64_t{g.block_size} * g.kv_heads;
  const int64_t data_bytes = per_block * g.head_dim * static_cast<int64_t>(KvElementBytes(g.dtype));
  const int64_t scale_bytes = g.dtype == KvDtype::kFp16 ? 0 : per_block * 4;
  if (data_bytes % 16 || scale_bytes % 16) {
    return absl::InvalidArgumentError("PrefetchKvToL2: a block's data and scales must be 16-byte multiples");
  }
  if (p.rows <= 0 || p.max_blocks_per_row <= 0) return absl::OkStatus();
  constexpr int kRowsPerCta = 4;
  PrefetchKvKernel<<<(p.rows + kRowsPerCta - 1) / kRowsPerCta, 32 * kRowsPerCta, 0, stream>>>(
      p, meta, g, layer, static_cast<uint32_t>(data_bytes), static_cast<uint32_t>(scale_bytes));
  TAILSERVE_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
