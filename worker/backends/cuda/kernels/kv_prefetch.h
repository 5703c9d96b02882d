#pragma once
// Pulls a layer's cached K/V blocks into L2 ahead of the decode attention. Above batch 1 the
// attention is latency-bound (its 16-row KV arrives at ~2.4 TB/s after its wait), while the
// q/k/v GEMM before it leaves SMs and some DRAM time idle; issued beside that GEMM, the blocks
// are L2 hits when the attention's tiles ask for them. A hint only: nothing it touches changes.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backends/cuda/kernels/kv_cache.h"

namespace tailserve::cuda {

struct KvPrefetch {
  int rows = 0;               // decode rows; row r holds positions [0, pos[r]] of block-table row seq[r]
  int max_blocks_per_row = 0;  // each row's first blocks only (0: none)
  bool evict_last = false;     // L2 eviction priority of the prefetched lines
};

// Every row's first min(max_blocks_per_row, pos / block_size + 1) blocks: K and V data, and for
// FP8 their scales. The data pieces must be 16-byte multiples (InvalidArgument otherwise).
absl::Status PrefetchKvToL2(const KvPrefetch& p, const RowMeta& meta, const KvGeometry& g, const KvLayerView& layer,
                            cudaStream_t stream);

}  // namespace tailserve::cuda
