#include "worker/backends/cuda/forward.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/copy.h"
#include "worker/backends/cuda/kernels/gemv.h"
#include "worker/backends/cuda/kernels/logprobs.h"
#include "worker/backends/cuda/kernels/rope_kv.h"
#include "worker/backends/cuda/kernels/rows.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"

namespace tailserve::cuda {

absl::StatusOr<StepStreams> StepStreams::Create() {
  StepStreams st;
  TAILSERVE_ASSIGN_OR_RETURN(st.main, MakeStream());
  TAILSERVE_ASSIGN_OR_RETURN(st.side, MakeStream());
  TAILSERVE_ASSIGN_OR_RETURN(st.fork, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(st.join, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(st.ffn_fork, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(st.ffn_join, MakeEvent());
  return st;
}

absl::Status ForwardPass::Run(const StepPlan& plan, int logit_rows, const GraphIo* io, OpProfile* profile) {
  const ModelConfig& c = c_;
  Workspaces& b = b_;
  cudaStream_t s = streams_.main.get();
  const int rows = plan.rows;
  const int h = static_cast<int>(c.hidden_size), f = static_cast<int>(c.intermediate_size),
            qd = static_cast<int>(c.q_dim()), kvd = static_cast<int>(c.kv_dim()), qkvw = qd + 2 * kvd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const RowMeta meta{b.row_seq, b.pos, b.block_table};
  AttentionShape shape{.rows = rows,
                       .heads = static_cast<int>(c.num_heads),
                       .q_stride = qkvw,
                       .sliding_window = static_cast<int>(c.sliding_window),
                       .splits = plan.attention_splits,
                       .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                       .runs = !plan.decode,
                       .new_kv = plan.new_kv,
                       .overlap_previous = plan.overlap_previous,
                       .cluster_merge = plan.cluster_merge,
                       .warps = plan.attention_warps};
  // Each op, then (when profiling) an event named after it.
#define TRY(what, expr)                                                                                        \
  do {                                                                                                         \
    TAILSERVE_RETURN_IF_ERROR(expr);                                                                           \
    if (profile && profile->names.size() < profile->events.size()) {                                           \
      TAILSERVE_CUDA_RETURN_IF_ERROR(                                                                          \
          cudaEventRecordWithFlags(profile->events[profile->names.size()].get(), s, cudaEventRecordExternal)); \
      profile->names.push_back(what);                                                                          \
    }                                                                                                          \
  } while (0)
  const bool fused = plan.fused_gemv;
  const int64_t qkv_stride = b.qkv_stride, residual_stride = b.residual_stride;
  // Residual contributions (split-K partials) not yet added into x: the next norm adds them.
  Partials pending;
  auto gemm_split_k = [&](GemmRunner& gemm, const __half* x, int k, const __half* w, int n, float* out, int64_t stride,
                          Partials* written, int ldw = 0) -> absl::Status {
    TAILSERVE_ASSIGN_OR_RETURN(const int chunks, gemm.RunSplitK(x, rows, k, w, n, kDecodeKSplits, out, stride, ldw));
    *written = {out, chunks, stride};
    return absl::OkStatus();
  };
  auto sumsq = [&](size_t slot) { return b.sumsq + slot; };
  // At batch 1 the embedding writes sumsq(0) and zeroes the slots the Gemvs accumulate into (no
  // memset node in the graph). In a graph, after the kernel that copies the inputs.
  const size_t layers = w_.layers.size();
  const int sumsq_slots = fused ? static_cast<int>(2 * layers + 1) : 0;
  TRY("embed", EmbedRows({.table = w_.embed,
                          .tokens = b.tokens,
                          .rows = rows,
                          .hidden = h,
                          .x = b.x,
                          .sumsq = fused ? sumsq(0) : nullptr,
                          .sumsq_slots = sumsq_slots},
                         s));
  for (size_t l = 0; l < layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const KvLayerView& kv_layer = pool_.layers[l];
    Partials qkv_in;  // none: the attention or RoPE reads b.qkv
    if (fused) {
      GemvArgs qkv{.x_f32 = b.x,
                   .k = h,
                   .w = L.w_qkv,
                   .n = qkvw,
                   .y = b.qkv,
                   .in_sumsq = sumsq(2 * l),
                   .eps = eps,
                   .overlap_previous = plan.overlap_previous};
      if (plan.new_kv) {  // the bias and RoPE, which RopeWriteKv applies otherwise
        qkv.bias = L.b_qkv, qkv.rope_head_dim = kv_.head_dim, qkv.rope_cols = qd + kvd, qkv.rope_pos = b.pos;
        qkv.rope_inv_freq = w_.inv_freq;
      }
      TRY("gemm_qkv", Gemv(qkv, s));
    } else {
      // The norm's weight is folded into w_qkv. Before StreamGemm it lets its follower start before
      // its own wait, so W streams during the previous kernel's last CTAs too.
      TRY("rmsnorm", RmsNormRows(b.x, pending, nullptr, rows, h, nullptr, eps, b.xn, s, plan.overlap_previous,
                                 plan.norm_triggers_qkv_early()));
      pending = {};
      if (plan.stream_qkv_chunks > 0) {
        TRY("gemm_qkv", StreamGemm({.x = b.xn,
                                    .rows = rows,
                                    .k = h,
                                    .w = L.w_qkv,
                                    .n = qkvw,
                                    .chunks = plan.stream_qkv_chunks,
                                    .partials = b.qkv_partials,
                                    .partial_stride = qkv_stride,
                                    .workspace = b.stream_counters + (1 + l % 2) * kStreamGemmWorkspaceBytes,
                                    .overlap_previous = plan.overlap_previous,
                                    .variant = plan.stream_qkv_variant},
                                   s));
        qkv_in = {b.qkv_partials, plan.stream_qkv_chunks, qkv_stride};
      } else if (plan.split_k) {
        TRY("gemm_qkv", gemm_split_k(gemm_, b.xn, h, L.w_qkv, qkvw, b.qkv_partials, qkv_stride, &qkv_in));
      } else {
        TRY("gemm_qkv", gemm_.Run(b.xn, rows, h, L.w_qkv, qkvw, 0.0f, b.qkv));
      }
    }
    if (plan.attention_block) {
      // The attention and o in one launch, o added into x; W_o streams once the key tiles are asked for.
      TRY("attention_block", AttentionBlock({.rows = rows,
                                             .hidden = h,
                                             .heads = static_cast<int>(c.num_heads),
                                             .bias = L.b_qkv,
                                             .w_o = L.w_o,
                                             .inv_freq = w_.inv_freq,
                                             .scale = shape.scale,
                                             .sliding_window = shape.sliding_window,
                                             .meta = meta,
                                             .geometry = kv_,
                                             .layer = kv_layer,
                                             .qkv_parts = qkv_in,
                                             .attn = b.attn,
                                             .x = b.x,
                                             .clamps = b.clamps,
                                             .workspace = b.attention_block_workspace,
                                             .overlap_previous = plan.overlap_previous},
                                            s));
    } else {
      if (!plan.new_kv) {
        TRY("rope_kv_write", RopeWriteKv(b.qkv, qkv_in, L.b_qkv, rows, static_cast<int>(c.num_heads), meta, kv_,
                                         kv_layer, w_.inv_freq, b.clamps, s, plan.overlap_previous));
      } else if (!fused) {
        // Each attention CTA sums its row's q/k/v partials and rotates its q heads and K itself.
        shape.rope = {.inv_freq = w_.inv_freq, .parts = qkv_in, .bias = L.b_qkv};
      }
      TRY("attention", PagedAttention(b.qkv, shape, meta, kv_, kv_layer, b.attn_partial, b.attn, s, b.clamps));
    }
    if (fused) {
      // o's CTAs start while the attention runs (its CTAs, or its combine, trigger before the end)
      // and copy W meanwhile.
      TRY("gemm_o", Gemv({.x = b.attn,
                          .k = qd,
                          .w = L.w_o,
                          .n = h,
                          .y = b.x,
                          .beta = 1.0f,
                          .bias = L.b_o,
                          .out_sumsq = sumsq(2 * l + 1),
                          .overlap_previous = plan.overlap_previous,
                          .preload_w = plan.overlap_previous},
                         s));
      TRY("gemm_gate_up", Gemv({.x_f32 = b.x,
                                .k = h,
                                .w = L.w_gate_up,
                                .n = 2 * f,
                                .swiglu_out = b.act,
                                .in_sumsq = sumsq(2 * l + 1),
                                .eps = eps,
                                .overlap_previous = plan.overlap_previous},
                               s));
      TRY("gemm_down", Gemv({.x = b.act,
                             .k = f,
                             .w = L.w_down,
                             .n = h,
                             .y = b.x,
                             .beta = 1.0f,
                             .out_sumsq = sumsq(2 * l + 2),
                             .overlap_previous = plan.overlap_previous},
                            s));
      continue;
    }
    if (plan.attention_block) {
      // o is in x already.
    } else if (plan.split_k) {
      TRY("gemm_o", gemm_split_k(gemm_, b.attn, qd, L.w_o, h, b.residual_partials, residual_stride, &pending));
    } else {
      TRY("gemm_o", gemm_.Run(b.attn, rows, qd, L.w_o, h, 1.0f, b.x));  // residual add fused into the GEMM
    }
    if (L.b_o) TRY("bias", AddBias(b.x, rows, h, L.b_o, s));
    // The norm's weight is folded into gate/up.
    TRY("rmsnorm", RmsNormRows(b.x, pending, nullptr, rows, h, nullptr, eps, b.xn, s, plan.overlap_previous,
                               plan.norm_triggers_ffn_early()));
    pending = {};
    if (plan.stream_ffn_chunks > 0) {
      TRY("ffn", StreamFfn({.x = b.xn,
                            .rows = rows,
                            .hidden = h,
                            .w_gate_up = L.w_gate_up,
                            .ffn = f,
                            .w_down = L.w_down,
                            .act = b.act,
                            .chunks = plan.stream_ffn_chunks,
                            .lag = kStreamFfnLag,
                            .partials = b.residual_partials,
                            .partial_stride = residual_stride,
                            .workspace = b.stream_counters,
                            .overlap_previous = plan.overlap_previous,
                            .k_boxes = 4,
                            .last_chunk = plan.stream_ffn_last_chunk,
                            .last_chunks = kStreamFfnLastChunks},
                           s));
      pending = {b.residual_partials, plan.stream_ffn_chunks, residual_stride};
    } else if (plan.ffn_halves) {
      // Gate and up interleave, so the first f rows of w_gate_up are the first f / 2 features'.
      cudaStream_t side = streams_.side.get();
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(streams_.ffn_fork.get(), s));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, streams_.ffn_fork.get(), 0));
      // Each half's down projection writes its k chunks' outputs after the other's; the next norm
      // adds them all.
      Partials downs[2];
      for (int half = 0; half < 2; ++half) {
        GemmRunner& gemm = half ? side_gemm_ : gemm_;
        float* gate_up = b.gate_up + static_cast<size_t>(half) * rows * f;
        __half* act = b.act + static_cast<size_t>(half) * rows * (f / 2);
        TRY("gemm_gate_up", gemm.Run(b.xn, rows, h, L.w_gate_up + static_cast<size_t>(half) * f * h, f, 0.0f, gate_up));
        TRY("swiglu", SwiGlu(gate_up, rows, f / 2, act, half ? side : s, plan.overlap_previous));
        float* out = b.residual_partials + (half ? downs[0].count * residual_stride : 0);
        TRY("gemm_down",
            gemm_split_k(gemm, act, f / 2, L.w_down + half * (f / 2), h, out, residual_stride, &downs[half],
                         /*ldw=*/f));
      }
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(streams_.ffn_join.get(), side));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, streams_.ffn_join.get(), 0));
      pending = {b.residual_partials, downs[0].count + downs[1].count, residual_stride};
    } else if (c.num_experts == 0) {
      TRY("gemm_gate_up", gemm_.Run(b.xn, rows, h, L.w_gate_up, 2 * f, 0.0f, b.gate_up));
      TRY("swiglu", SwiGlu(b.gate_up, rows, f, b.act, s, plan.overlap_previous));
      if (plan.split_k) {
        TRY("gemm_down", gemm_split_k(gemm_, b.act, f, L.w_down, h, b.residual_partials, residual_stride, &pending));
      } else {
        TRY("gemm_down", gemm_.Run(b.act, rows, f, L.w_down, h, 1.0f, b.x));
      }
    } else {
      // Every expert runs over every row and rows it did not route to get weight 0: wasteful
      // (experts / top_k times the FLOPs) but shape-static, so it lives in the graph.
      const int E = static_cast<int>(c.num_experts);
      TRY("moe_router", MoeRouterLogits(b.x, rows, h, L.mlp_norm, eps, L.w_router, E, b.router_logits, s));
      TRY("moe_route", MoeRoute(b.router_logits, rows, E, static_cast<int>(c.experts_per_token), b.route_weights, s));
      for (int e = 0; e < E; ++e) {
        TRY("gemm_gate_up", gemm_.Run(b.xn, rows, h, L.expert_gate_up[e], 2 * f, 0.0f, b.gate_up));
        TRY("swiglu", SwiGlu(b.gate_up, rows, f, b.act, s, plan.overlap_previous));
        TRY("gemm_down", gemm_.Run(b.act, rows, f, L.expert_down[e], h, 0.0f, b.expert_out));
        TRY("moe_combine", AddScaledRows(b.x, b.expert_out, b.route_weights + e, E, rows, h, s));
      }
    }
  }
  if (io) {
    // The clamp count is final after the last layer: a side branch copies it out while the LM
    // head streams, instead of a copy kernel after the sampler.
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(streams_.fork.get(), s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(streams_.side.get(), streams_.fork.get(), 0));
    TAILSERVE_RETURN_IF_ERROR(CopyBytes(b.clamps, io->clamps, sizeof(*b.clamps), streams_.side.get()));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(streams_.join.get(), streams_.side.get()));
  }
  if (logit_rows > 0 && fused) {  // the final norm in the LM head's epilogue (its weight folded into lm_head)
    TRY("lm_head", Gemv({.x_f32 = b.x,
                         .k = h,
                         .w = w_.lm_head,
                         .n = static_cast<int>(c.vocab_size),
                         .y = b.logits,
                         .in_sumsq = sumsq(2 * layers),
                         .eps = eps,
                         .overlap_previous = plan.overlap_previous},
                        s));
  } else if (logit_rows > 0) {
    TRY("final_norm", RmsNormRows(b.x, pending, b.logit_src, logit_rows, h, nullptr, eps, b.final_xn, s));
    pending = {};
    TRY("lm_head", gemm_.Run(b.final_xn, logit_rows, h, w_.lm_head, static_cast<int>(c.vocab_size), 0.0f, b.logits));
  }
  if (logit_rows > 0 && plan.decode) {
    TRY("sample", SampleRows(b.logits, logit_rows, static_cast<int>(c.vocab_size), b.params,
                             io ? io->sampled : b.out_tokens, s, plan.overlap_previous));
    TRY("logprobs", LogprobRows(b.logits, logit_rows, static_cast<int>(c.vocab_size), b.params,
                                io ? io->sampled : b.out_tokens, b.logprobs, s));
  }
  if (io) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, streams_.join.get(), 0));
#undef TRY
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
