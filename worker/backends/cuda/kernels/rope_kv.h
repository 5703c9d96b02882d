#pragma once
// RoPE fused with the KV-cache write: adds the q/k/v projection bias, rotates q in place and k on
// its way to the cache, and quantises k and v into the paged cache (FP8 with a per-token, per-head
// scale, or FP16). Values that cannot be represented are clamped, never stored as inf/NaN, and
// counted in *clamps.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/partials.h"

namespace tailserve::cuda {

// qkv: fp32 [rows, (heads + 2 * kv_heads) * head_dim], q then k then v per row; bias: same width
// or null; inv_freq: [head_dim / 2]. head_dim at most 256 and even. With `in` (arrays laid out as
// qkv: a split-K projection's partials), the projection is their sum and qkv only receives the
// rotated q; otherwise qkv is read and q rotated in place. overlap_previous: launched
// programmatically (common.cuh), it waits for the previous kernel before it reads its input.
absl::Status RopeWriteKv(float* qkv, const Partials& in, const float* bias, int rows, int heads, const RowMeta& meta,
                         const KvGeometry& geometry, const KvLayerView& layer, const float* inv_freq,
                         unsigned long long* clamps, cudaStream_t stream, bool overlap_previous = false);

// Reads back one cached head vector as fp32 (for tests): out[head_dim].
absl::Status ReadKvForTest(const KvGeometry& geometry, const KvLayerView& layer, bool value, int block, int slot,
                           int kv_head, float* out, cudaStream_t stream);

}  // namespace tailserve::cuda
