#include "worker/backends/cuda/workspaces.h"

#include <algorithm>
#include <cstring>

#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/partials.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"
#include "worker/backends/cuda/plan/decode_plan.h"

namespace tailserve::cuda {

absl::StatusOr<std::unique_ptr<Workspaces>> AllocateWorkspaces(const ModelConfig& c, const KvGeometry& kv,
                                                               const WorkspaceSizes& sizes, int trash_row) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t R = sizes.max_rows, L = sizes.logit_rows, E = std::max<int64_t>(c.num_experts, 1);
  const int64_t bucket = sizes.max_bucket;
  const AttentionShape shape{
      .rows = static_cast<int>(R), .heads = static_cast<int>(c.num_heads), .splits = sizes.attention_splits};
  const size_t table_entries = static_cast<size_t>(sizes.table_rows) * kv.max_blocks_per_seq;
  auto b = std::make_unique<Workspaces>();
  // Inputs region: tokens, pos, row_seq [R]; logit_src [L]; params [L].
  const size_t inputs_bytes = 3 * R * 4 + L * 4 + 64 + L * sizeof(SampleParams);
  const size_t work_bytes =
      inputs_bytes + 256 + L * 4 + 8 + 512 + L * sizeof(RowLogprobs) + 256 + table_entries * 4 + 256 + R * h * 4 + R * h * 2 + R * (qd + 2 * kvd) * 4 +
      R * qd * 2 + R * 2 * f * 4 + R * f * 2 + AttentionWorkspaceFloats(shape, static_cast<int>(c.head_dim)) * 4 +
      (c.num_experts ? 2 * R * E * 4 + R * h * 4 : 0) + L * h * 2 + L * c.vocab_size * 4 +
      (2 * static_cast<size_t>(c.num_layers) + 1) * 4 +
      (kMaxPartials * bucket * (qd + 2 * kvd) + 2 * kDecodeKSplits * bucket * h) * 4 + 2 * b->cublas_workspace_bytes +
      3 * kStreamGemmWorkspaceBytes + kAttentionBlockWorkspaceBytes + 64 * 256;
  TAILSERVE_ASSIGN_OR_RETURN(b->memory, DeviceAlloc(work_bytes));
  b->bytes = work_bytes;
  DeviceArena a(b->memory.get(), work_bytes);
  b->inputs = a.Take<char>(inputs_bytes);
  b->inputs_bytes = inputs_bytes;
  auto* base = static_cast<char*>(b->inputs);
  size_t off = 0;
  auto place = [&](size_t bytes) {
    const size_t at = off;
    off = (off + bytes + 15) & ~size_t{15};
    return at;
  };
  const size_t o_tokens = place(R * 4), o_pos = place(R * 4), o_seq = place(R * 4), o_src = place(L * 4),
               o_params = place(L * sizeof(SampleParams));
  b->tokens = reinterpret_cast<int32_t*>(base + o_tokens);
  b->pos = reinterpret_cast<int32_t*>(base + o_pos);
  b->row_seq = reinterpret_cast<int32_t*>(base + o_seq);
  b->logit_src = reinterpret_cast<int32_t*>(base + o_src);
  b->params = reinterpret_cast<SampleParams*>(base + o_params);
  TAILSERVE_ASSIGN_OR_RETURN(b->host_inputs, PinnedAlloc(inputs_bytes));
  TAILSERVE_ASSIGN_OR_RETURN(b->mapped_inputs, MappedDevicePointer(b->host_inputs));
  auto* hbase = static_cast<char*>(b->host_inputs.get());
  b->h_tokens = reinterpret_cast<int32_t*>(hbase + o_tokens);
  b->h_pos = reinterpret_cast<int32_t*>(hbase + o_pos);
  b->h_row_seq = reinterpret_cast<int32_t*>(hbase + o_seq);
  b->h_logit_src = reinterpret_cast<int32_t*>(hbase + o_src);
  b->h_params = reinterpret_cast<SampleParams*>(hbase + o_params);
  b->clamps_at = (L * 4 + 15) & ~size_t{15};  // 16-byte aligned for CopyBytes
  b->outputs_bytes = b->clamps_at + 8;
  auto* outputs = a.Take<char>(b->outputs_bytes);
  b->out_tokens = reinterpret_cast<int32_t*>(outputs);
  b->clamps = reinterpret_cast<unsigned long long*>(outputs + b->clamps_at);
  TAILSERVE_ASSIGN_OR_RETURN(b->host_outputs, PinnedAlloc(b->outputs_bytes));
  TAILSERVE_ASSIGN_OR_RETURN(void* mapped_out, MappedDevicePointer(b->host_outputs));
  b->graph_io.sampled = static_cast<int32_t*>(mapped_out);
  b->graph_io.clamps = reinterpret_cast<unsigned long long*>(static_cast<char*>(mapped_out) + b->clamps_at);
  b->logprobs = a.Take<RowLogprobs>(L);
  TAILSERVE_ASSIGN_OR_RETURN(b->host_logprobs, PinnedAlloc(L * sizeof(RowLogprobs)));
  b->block_table = a.Take<int32_t>(table_entries);
  TAILSERVE_ASSIGN_OR_RETURN(b->host_table, PinnedAlloc(table_entries * 4));
  b->x = a.Take<float>(R * h);
  b->xn = a.Take<__half>(R * h);
  b->qkv = a.Take<float>(R * (qd + 2 * kvd));
  b->attn = a.Take<__half>(R * qd);
  b->gate_up = a.Take<float>(R * 2 * f);
  b->act = a.Take<__half>(R * f);
  b->attn_partial = a.Take<float>(AttentionWorkspaceFloats(shape, static_cast<int>(c.head_dim)));
  if (c.num_experts) {
    b->router_logits = a.Take<float>(R * E);
    b->route_weights = a.Take<float>(R * E);
    b->expert_out = a.Take<float>(R * h);
  }
  b->sumsq = a.Take<float>(2 * static_cast<size_t>(c.num_layers) + 1);
  b->final_xn = a.Take<__half>(L * h);
  b->logits = a.Take<float>(L * c.vocab_size);
  b->qkv_partials = a.Take<float>(kMaxPartials * bucket * (qd + 2 * kvd));
  b->qkv_stride = bucket * (qd + 2 * kvd);
  b->attention_block_workspace = a.Take<char>(kAttentionBlockWorkspaceBytes);
  b->residual_partials = a.Take<float>(2 * kDecodeKSplits * bucket * h);
  b->residual_stride = bucket * h;
  b->stream_counters = a.Take<char>(3 * kStreamGemmWorkspaceBytes);
  b->cublas_workspace = a.Take<char>(b->cublas_workspace_bytes);
  b->side_cublas_workspace = a.Take<char>(b->cublas_workspace_bytes);
  if (!b->side_cublas_workspace) return absl::InternalError("cuda: workspace arena too small (a sizing bug)");
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b->clamps, 0, 8));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b->stream_counters, 0, 3 * kStreamGemmWorkspaceBytes));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b->attention_block_workspace, 0, kAttentionBlockWorkspaceBytes));
  std::memset(b->host_inputs.get(), 0, inputs_bytes);
  for (int64_t i = 0; i < R; ++i) b->h_row_seq[i] = trash_row;
  std::memset(b->host_table.get(), 0, table_entries * 4);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b->block_table, 0, table_entries * 4));
  return b;
}

absl::StatusOr<KvPool> AllocateKvPool(const ModelConfig& c, const KvGeometry& kv, double fraction, int64_t max_blocks) {
  size_t free_bytes = 0, total_bytes = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const bool scaled = kv.dtype != KvDtype::kFp16;
  const size_t per_block_layer = static_cast<size_t>(kv.block_size) * kv.kv_heads *
                                 (kv.head_dim * KvElementBytes(kv.dtype) + (scaled ? 4 : 0)) * 2;
  const size_t per_block = per_block_layer * static_cast<size_t>(c.num_layers);
  KvPool pool;
  pool.num_blocks = static_cast<int64_t>(free_bytes * fraction / per_block);
  if (max_blocks > 0) pool.num_blocks = std::min(pool.num_blocks, max_blocks);
  if (pool.num_blocks < 2) return absl::ResourceExhaustedError("cuda: no device memory left for the KV cache");
  pool.bytes = per_block * static_cast<size_t>(pool.num_blocks) + 256 * 4 * c.num_layers;
  TAILSERVE_ASSIGN_OR_RETURN(pool.memory, DeviceAlloc(pool.bytes));
  DeviceArena ka(pool.memory.get(), pool.bytes);
  const size_t elems = static_cast<size_t>(pool.num_blocks) * kv.block_size * kv.kv_heads * kv.head_dim;
  const size_t scales = static_cast<size_t>(pool.num_blocks) * kv.block_size * kv.kv_heads;
  pool.layers.resize(static_cast<size_t>(c.num_layers));
  for (KvLayerView& layer : pool.layers) {
    layer.k = ka.Take<char>(elems * KvElementBytes(kv.dtype));
    layer.v = ka.Take<char>(elems * KvElementBytes(kv.dtype));
    if (scaled) {
      layer.k_scale = ka.Take<float>(scales);
      layer.v_scale = ka.Take<float>(scales);
    }
    if (!layer.v) return absl::InternalError("cuda: KV arena too small (a sizing bug)");
  }
  return pool;
}

}  // namespace tailserve::cuda
