#pragma once
// Everything a forward writes besides the KV cache, carved from one device allocation made at
// load: the step's inputs (one pinned host mirror, one device copy), its outputs, the block table,
// the activations and the kernels' scratch. Sized for the largest forward (max_rows rows, of which
// logit_rows produce logits); nothing is allocated on the serving path.
#include <cuda_fp16.h>

#include <memory>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/logprobs.h"
#include "worker/backends/cuda/kernels/sampling.h"

namespace tailserve::cuda {

// Where a decode graph's forward leaves the sampled ids and the clamp count: the host mirrors'
// mapped addresses, so no copy sits at the end of the step's chain.
struct GraphIo {
  int32_t* sampled = nullptr;
  unsigned long long* clamps = nullptr;
};

struct WorkspaceSizes {
  int max_rows = 0;    // rows of one forward
  int logit_rows = 0;  // rows whose logits one forward can produce
  int max_bucket = 0;  // the largest decode graph's rows (split-K partials are sized for it)
  int table_rows = 0;  // block-table rows: the sequences plus the trash row
  int attention_splits = 1;  // the most attention splits a plan may take
};

struct Workspaces {
  DeviceMemory memory;
  size_t bytes = 0;
  // Step inputs: one pinned host mirror, one device copy, uploaded together before each forward
  // (a decode graph copies the mirror itself, through its mapped address).
  PinnedMemory host_inputs;
  const void* mapped_inputs = nullptr;
  size_t inputs_bytes = 0;
  void* inputs = nullptr;        // device base
  int32_t* tokens = nullptr;     // device [max_rows]
  int32_t* pos = nullptr;
  int32_t* row_seq = nullptr;    // block-table row of each row
  int32_t* logit_src = nullptr;  // [logit_rows] row whose hidden state feeds each logits row
  SampleParams* params = nullptr;  // [logit_rows]
  // Host views into host_inputs at the same offsets.
  int32_t* h_tokens = nullptr;
  int32_t* h_pos = nullptr;
  int32_t* h_row_seq = nullptr;
  int32_t* h_logit_src = nullptr;
  SampleParams* h_params = nullptr;

  // Outputs, one region copied back after the forward: out_tokens, then clamps at clamps_at.
  int32_t* out_tokens = nullptr;
  unsigned long long* clamps = nullptr;
  size_t clamps_at = 0, outputs_bytes = 0;
  PinnedMemory host_outputs;
  // The host mirrors' mapped addresses a decode graph writes the sampled ids and clamp count to.
  GraphIo graph_io{};
  // The sampled tokens' log-probabilities [logit_rows], copied back only when a row asked for them.
  RowLogprobs* logprobs = nullptr;
  PinnedMemory host_logprobs;

  int32_t* block_table = nullptr;  // [table_rows, max_blocks_per_seq]
  PinnedMemory host_table;         // its host mirror (KvBlockAllocator writes it)

  float* x = nullptr;       // residual stream, fp32 [max_rows, h]
  __half* xn = nullptr;     // normed, fp16 [max_rows, h]
  float* qkv = nullptr;     // [max_rows, q + 2 kv]
  __half* attn = nullptr;   // [max_rows, q]
  float* gate_up = nullptr;  // [max_rows, 2 ffn]
  __half* act = nullptr;    // [max_rows, ffn]
  float* attn_partial = nullptr;
  float* router_logits = nullptr;  // MoE [max_rows, experts]
  float* route_weights = nullptr;
  float* expert_out = nullptr;     // MoE [max_rows, h]
  float* sumsq = nullptr;          // [2 layers + 1]: Σ x² of the residual before each norm (batch 1)
  __half* final_xn = nullptr;      // [logit_rows, h]
  float* logits = nullptr;         // [logit_rows, vocab]
  // Decode above batch 1: the split-K projections' chunk outputs (kDecodeKSplits, or StreamGemm's
  // q/k/v and StreamFfn's down chunks), which the attention and the norms add.
  float* qkv_partials = nullptr;  // [kMaxPartials][max_bucket, q + 2 kv]
  int64_t qkv_stride = 0;
  void* attention_block_workspace = nullptr;  // AttentionBlock's counters (zeroed once; each launch leaves them so)
  float* residual_partials = nullptr;  // [2 kDecodeKSplits][max_bucket, h]: o's, or the FFN's down
  int64_t residual_stride = 0;
  // StreamFfn's workspace, then StreamGemm's q/k/v's two (even and odd layers: a programmatic
  // launch claims items before its wait, so no launch shares the counter of one that may still run).
  char* stream_counters = nullptr;
  void* cublas_workspace = nullptr;
  void* side_cublas_workspace = nullptr;  // the side branch's GemmRunner's, as large
  size_t cublas_workspace_bytes = size_t{32} << 20;
};

// The inputs start valid (token 0 at position 0 of the trash row, `trash_row`) so padded graph
// rows are harmless; the block table and counters start zeroed.
absl::StatusOr<std::unique_ptr<Workspaces>> AllocateWorkspaces(const ModelConfig& config, const KvGeometry& kv,
                                                               const WorkspaceSizes& sizes, int trash_row);

// The paged KV cache: what device memory is left after weights and workspaces, times `fraction`,
// in blocks of every layer.
struct KvPool {
  DeviceMemory memory;
  size_t bytes = 0;
  int64_t num_blocks = 0;
  std::vector<KvLayerView> layers;
};
// `fraction` of the free device memory, at most `max_blocks` blocks (0: no cap).
absl::StatusOr<KvPool> AllocateKvPool(const ModelConfig& config, const KvGeometry& kv, double fraction,
                                      int64_t max_blocks = 0);

}  // namespace tailserve::cuda
