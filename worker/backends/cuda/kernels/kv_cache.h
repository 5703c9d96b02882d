#pragma once
// The paged KV cache's layout, shared by the kernels that write it (RoPE + quantise) and read it
// (attention). Per layer, K and V each hold [num_blocks, block_size, kv_heads, head_dim] elements;
// FP8 entries carry one fp32 scale per (block, slot, kv head) beside the data, so every token's
// head is scaled to its own amax and no value can overflow silently.
#include <cstddef>
#include <cstdint>

#include "worker/engine/kv_dtype.h"

namespace tailserve {

// One layer's slice of the pool (device pointers).
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  float* k_scale = nullptr;  // [num_blocks, block_size, kv_heads]; unused for fp16
  float* v_scale = nullptr;
};

struct KvGeometry {
  int32_t block_size = 16;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t max_blocks_per_seq = 0;  // row stride of the block table
  KvDtype dtype = KvDtype::kFp8E4M3;
};

// Which sequence (block-table row) and position each token row of a step belongs to.
struct RowMeta {
  const int32_t* seq = nullptr;          // [rows] block-table row
  const int32_t* pos = nullptr;          // [rows] position in its sequence
  const int32_t* block_table = nullptr;  // [seqs, max_blocks_per_seq]
};

}  // namespace tailserve
