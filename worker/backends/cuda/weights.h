#pragma once
// The model's weights on the device, loaded once: matrices in fp16 (each RMSNorm's weight folded
// into the matrix that consumes the normed rows, gate and up interleaved), norms, biases and the
// MoE router in fp32, all in one allocation, layer after layer.
#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "worker/backends/cuda/cuda_resources.h"

namespace tailserve::cuda {

struct LayerWeights {
  const float* mlp_norm = nullptr;   // MoE only: the router's input norm (folded into the matrices elsewhere)
  const __half* w_qkv = nullptr;     // [q + 2 kv, h]
  const float* b_qkv = nullptr;      // or null
  const __half* w_o = nullptr;       // [h, q]
  const float* b_o = nullptr;        // or null
  const __half* w_gate_up = nullptr;  // [2 ffn, h], gate and up rows interleaved (dense)
  const __half* w_down = nullptr;     // [h, ffn] (dense)
  const float* w_router = nullptr;    // [experts, h], fp32 (see MoeRouterLogits)
  std::vector<const __half*> expert_gate_up, expert_down;
};

struct ModelWeights {
  DeviceMemory memory;
  size_t bytes = 0;
  const __half* embed = nullptr;    // [vocab, h]
  const __half* lm_head = nullptr;  // [vocab, h], the final norm's weight folded in
  const float* inv_freq = nullptr;  // RoPE [head_dim / 2]
  std::vector<LayerWeights> layers;

  // Bytes between one layer's weight matrices and the next's when every dense layer's are that
  // far apart (GemmRunner times a shape over every layer's W with it); else 0.
  int64_t LayerStrideBytes() const;
};

// OUT_OF_RANGE naming the tensor when a weight (times its folded norm weight) leaves fp16's range.
absl::StatusOr<ModelWeights> LoadModelWeights(const Checkpoint& ckpt);

}  // namespace tailserve::cuda
