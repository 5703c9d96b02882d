#include "worker/backends/cuda/cuda_engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/copy.h"
#include "worker/backends/cuda/kernels/gemv.h"
#include "worker/backends/cuda/kernels/rope_kv.h"
#include "worker/backends/cuda/kernels/rows.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"

namespace tailserve {
namespace {

// Decode above batch 1 splits the k range of the q/k/v, o and down projections in two
// (GemmRunner::RunSplitK); RoPE and the next RMSNorm add the halves. Kernel bench, H200, 8B
// shape, 16 / 32 / 64 rows (µs, cuBLASLt's best pick of each): q/k/v 16.3 / 16.1 / 16.2 → 15.0 /
// 15.3 / 15.7, o (with its split-K reduce) 12.9 / 13.7 / 11.6 → 10.6 / 10.7 / 11.1, down 32.8 /
// 33.4 / 34.9 → 30.3 / 30.3 / 31.2; 4 and 8 chunks were slower than 2, gate/up gains nothing.
constexpr int kDecodeKSplits = 2;

}  // namespace

struct CudaEngine::Buffers {
  // Step inputs: one pinned host mirror, one device copy, uploaded together before each forward
  // (a decode graph copies the mirror itself, through its mapped address).
  PinnedMemory host_inputs;
  const void* mapped_inputs = nullptr;
  size_t inputs_bytes = 0;
  int32_t* tokens = nullptr;  // device [max_rows]
  int32_t* pos = nullptr;
  int32_t* row_seq = nullptr;
  int32_t* logit_src = nullptr;  // [logit_rows] row whose hidden state feeds each logits row
  cuda::SampleParams* params = nullptr;  // [logit_rows]
  // Host views into host_inputs at the same offsets.
  int32_t* h_tokens = nullptr;
  int32_t* h_pos = nullptr;
  int32_t* h_row_seq = nullptr;
  int32_t* h_logit_src = nullptr;
  cuda::SampleParams* h_params = nullptr;
  void* inputs = nullptr;  // device base

  // Outputs, one region copied back after the forward: out_tokens, then clamps at clamps_at.
  int32_t* out_tokens = nullptr;
  unsigned long long* clamps = nullptr;
  size_t clamps_at = 0, outputs_bytes = 0;
  PinnedMemory host_outputs;
  // The host mirrors' mapped addresses a decode graph reads the token ids from and writes the
  // sampled ids and clamp count to.
  GraphIo graph_io{};

  int32_t* block_table = nullptr;  // [(max_sequences + 1), max_blocks_per_seq]
  PinnedMemory host_table;

  float* x = nullptr;               // residual stream, fp32 [max_rows, h]
  __half* xn = nullptr;      // normed, fp16 [max_rows, h]
  float* qkv = nullptr;             // [max_rows, q + 2 kv]
  __half* attn = nullptr;    // [max_rows, q]
  float* gate_up = nullptr;         // [max_rows, 2 ffn]
  __half* act = nullptr;     // [max_rows, ffn]
  float* attn_partial = nullptr;
  float* router_logits = nullptr;   // MoE [max_rows, experts]
  float* route_weights = nullptr;
  float* expert_out = nullptr;      // MoE [max_rows, h]
  float* sumsq = nullptr;            // [2 layers + 1]: Σ x² of the residual before each norm (batch 1)
  __half* final_xn = nullptr;  // [logit_rows, h]
  float* logits = nullptr;          // [logit_rows, vocab]
  // Decode above batch 1: the split-K projections' chunk outputs (kDecodeKSplits, or StreamGemm's
  // q/k/v and StreamFfn's down chunks), which the attention (RoPE with an FP16 cache) and the norms add.
  float* qkv_partials = nullptr;       // [kMaxPartials][max_bucket, q + 2 kv]
  void* attention_block_workspace = nullptr;  // AttentionBlock's counters (zeroed once; each launch leaves them so)
  float* residual_partials = nullptr;  // [2 kDecodeKSplits][max_bucket, h]: o's, or the FFN halves' (StreamFfn's) down
  // StreamFfn's workspace, then StreamGemm's q/k/v's two (even and odd layers: a programmatic
  // launch claims items before its wait, so no launch shares the counter of one that may still run).
  char* stream_counters = nullptr;
  void* cublas_workspace = nullptr;
  void* side_cublas_workspace = nullptr;  // side_gemm_'s, as large
  size_t cublas_workspace_bytes = 32 << 20;
};

CudaEngine::CudaEngine(const CudaEngineOptions& options) : options_(options) {}

CudaEngine::~CudaEngine() {
  if (stream_) cudaStreamSynchronize(stream_.get());
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Load(const std::string& dir, const CudaEngineOptions& options) {
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  if (!ckpt.ok()) return ckpt.status();
  std::unique_ptr<CudaEngine> e(new CudaEngine(options));
  e->model_id_ = std::filesystem::path(dir).lexically_normal().filename().string();
  if (absl::Status s = e->Init(*ckpt); !s.ok()) return s;
  return e;
}

absl::Status CudaEngine::Init(const Checkpoint& ckpt) {
  config_ = ckpt.config;
  const ModelConfig& c = config_;
  if (options_.buckets.empty()) return absl::InvalidArgumentError("cuda: at least one batch bucket is needed");
  if (options_.attention_block_key_stages != 2 &&
      (options_.attention_block != CudaEngineOptions::AttentionBlockUse::kAfterQkv ||
       options_.attention_block_key_stages < 2 || options_.attention_block_key_stages > 4)) {
    return absl::InvalidArgumentError("cuda: 3-4 attention block key stages only with the block after q/k/v");
  }
  if (options_.stream_ffn_ctas_per_sm < 1 || options_.stream_ffn_ctas_per_sm > 2) {
    return absl::InvalidArgumentError("cuda: one or two StreamFfn CTAs an SM");
  }
  if (options_.stream_ffn_last_chunk < -1 || options_.stream_ffn_min_rows < 2) {
    return absl::InvalidArgumentError("cuda: a StreamFfn last chunk of -1 (the rule) or more, from 2 rows or more");
  }
  if (options_.stream_qkv_chunks < 0 || options_.stream_qkv_chunks > cuda::kMaxPartials) {
    return absl::InvalidArgumentError(absl::StrCat("cuda: 0-", cuda::kMaxPartials, " StreamGemm q/k/v chunks"));
  }
  if (options_.norm_trigger_first < 0 || options_.norm_trigger_first > 3) {
    return absl::InvalidArgumentError("cuda: norm_trigger_first is a mask of bits 0 and 1");
  }
  std::sort(options_.buckets.begin(), options_.buckets.end());
  max_bucket_ = options_.buckets.back();
  max_rows_ = std::max(options_.prefill_chunk, max_bucket_);
  logit_rows_ = std::max(options_.logits_rows, max_bucket_);
  max_context_ = static_cast<int32_t>(options_.max_context > 0 ? std::min<int64_t>(options_.max_context, c.max_position)
                                                               : c.max_position);
  kv_ = {.block_size = options_.block_size, .kv_heads = static_cast<int32_t>(c.num_kv_heads),
         .head_dim = static_cast<int32_t>(c.head_dim),
         .max_blocks_per_seq = (max_context_ + options_.block_size - 1) / options_.block_size, .dtype = options_.kv_dtype};
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, options_.device));
  absl::StatusOr<int> per_sm = cuda::AttentionCtasPerSm({.heads = static_cast<int>(c.num_heads)}, kv_);
  if (!per_sm.ok()) return per_sm.status();
  attention_wave_ = *per_sm * sm_count_;
  if (absl::StatusOr<int> gemv_wave = cuda::GemvWave(); !gemv_wave.ok()) return gemv_wave.status();
  absl::StatusOr<CudaStream> stream = MakeStream();
  if (!stream.ok()) return stream.status();
  stream_ = *std::move(stream);
  absl::StatusOr<CudaStream> side = MakeStream();
  if (!side.ok()) return side.status();
  side_stream_ = *std::move(side);
  absl::StatusOr<CudaEvent> fork = MakeEvent(), join = MakeEvent();
  if (!fork.ok()) return fork.status();
  if (!join.ok()) return join.status();
  fork_ = *std::move(fork), join_ = *std::move(join);
  absl::StatusOr<CudaEvent> ffn_fork = MakeEvent(), ffn_join = MakeEvent();
  if (!ffn_fork.ok()) return ffn_fork.status();
  if (!ffn_join.ok()) return ffn_join.status();
  ffn_fork_ = *std::move(ffn_fork), ffn_join_ = *std::move(ffn_join);
  if (absl::Status s = LoadWeights(ckpt); !s.ok()) return s;
  if (absl::Status s = AllocateWorkspaces(); !s.ok()) return s;
  if (options_.use_graphs) {
    if (absl::Status s = CaptureGraphs(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// fp16 bits of a checkpoint tensor. Matrices run as fp16 (not bf16): 3 more mantissa bits in the
// activations that feed every GEMM keep the logits within 1e-2 of fp32 maths (bf16 activations
// measured 1.1-1.5e-2 on the reference models); bf16 weights convert exactly unless they leave
// fp16's range, which is refused rather than silently clamped.
absl::Status ToHalf(const TensorInfo& t, std::vector<uint16_t>* out) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> f(n);
  ToFloat(t.dtype, t.data, n, f.data());
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(f[i]) > 65504.0f) {
      return absl::OutOfRangeError(absl::StrCat(t.file, ": tensor ", t.name, " holds ", f[i],
                                                ", outside the fp16 range the CUDA backend computes in"));
    }
    const __half h = __float2half_rn(f[i]);
    std::memcpy(&(*out)[i], &h, 2);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaEngine::LoadWeights(const Checkpoint& ckpt) {
  const ModelConfig& c = config_;
  const TensorStore& t = ckpt.tensors;
  // One allocation holds every weight: matrices in fp16, norms and biases in fp32.
  size_t exact = static_cast<size_t>(c.head_dim) * 4 + 256;  // + the RoPE frequencies
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const bool fp32 = spec.shape.size() == 1 || spec.name.find("block_sparse_moe.gate.") != std::string::npos;
    exact += static_cast<size_t>(n) * (fp32 ? 4 : 2) + 256;
  }
  // Tied embeddings: the LM head is a copy of the table with the final norm's weight folded in.
  if (c.tie_word_embeddings) exact += static_cast<size_t>(c.vocab_size * c.hidden_size) * 2 + 256;
  absl::StatusOr<DeviceMemory> mem = DeviceAlloc(exact);
  if (!mem.ok()) return mem.status();
  weight_memory_ = *std::move(mem);
  memory_["weights"] = exact;
  DeviceArena arena(weight_memory_.get(), exact);

  std::vector<uint16_t> host;
  std::vector<float> hostf;
  // Copies tensors (concatenated along their first dimension) into one fp16 device matrix. With
  // col_scale, column j of every tensor is multiplied by col_scale[j] first (an RMSNorm weight
  // folded into its consumer); with interleave (two tensors of equal shape), their rows alternate.
  auto matrix = [&](std::vector<std::string> names, std::vector<std::vector<int64_t>> shapes, const __half** out,
                    const std::vector<float>* col_scale = nullptr, bool interleave = false) -> absl::Status {
    int64_t total = 0;
    for (auto& s : shapes) total += s[0] * s[1];
    auto* dst = arena.Take<__half>(static_cast<size_t>(total));
    if (col_scale == nullptr && !interleave) {
      int64_t at = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        absl::StatusOr<const TensorInfo*> info = t.Get(names[i], shapes[i]);
        if (!info.ok()) return info.status();
        if (absl::Status s = ToHalf(**info, &host); !s.ok()) return s;
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst + at, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
        at += static_cast<int64_t>(host.size());
      }
      *out = dst;
      return absl::OkStatus();
    }
    host.resize(static_cast<size_t>(total));
    int64_t first_row = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      if (absl::Status s = t.ReadFloat(names[i], shapes[i], &hostf); !s.ok()) return s;
      const int64_t rows = shapes[i][0], cols = shapes[i][1];
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t dst_row = interleave ? 2 * r + static_cast<int64_t>(i) : first_row + r;
        for (int64_t j = 0; j < cols; ++j) {
          const float v = hostf[static_cast<size_t>(r * cols + j)] * (col_scale ? (*col_scale)[static_cast<size_t>(j)] : 1.0f);
          if (std::fabs(v) > 65504.0f) {
            return absl::OutOfRangeError(absl::StrCat(names[i], " times its norm weight holds ", v,
                                                      ", outside the fp16 range the CUDA backend computes in"));
          }
          const __half hv = __float2half_rn(v);
          std::memcpy(&host[static_cast<size_t>(dst_row * cols + j)], &hv, 2);
        }
      }
      first_row += rows;
    }
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    *out = dst;
    return absl::OkStatus();
  };
  // fp32 tensors (norms, biases, the MoE router), concatenated; `shape` when not one-dimensional.
  auto vector = [&](std::vector<std::string> names, std::vector<int64_t> sizes, const float** out,
                    std::vector<int64_t> shape = {}) -> absl::Status {
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    auto* dst = arena.Take<float>(static_cast<size_t>(total));
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::vector<int64_t> want = shape.empty() ? std::vector<int64_t>{sizes[i]} : shape;
      if (absl::Status s = t.ReadFloat(names[i], want, &hostf); !s.ok()) return s;
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst + at, hostf.data(), hostf.size() * 4, cudaMemcpyHostToDevice));
      at += sizes[i];
    }
    *out = dst;
    return absl::OkStatus();
  };
#define TRY(expr)                            \
  do {                                       \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)
  const int64_t h = c.hidden_size, f = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  TRY(matrix({"model.embed_tokens.weight"}, {{c.vocab_size, h}}, &embed_));
  // The final norm's weight is folded into the LM head like the layers' norms, so at batch 1 the
  // LM head Gemv normalises in its epilogue and the step has no norm kernel before it.
  std::vector<float> final_gamma;
  TRY(t.ReadFloat("model.norm.weight", std::vector<int64_t>{h}, &final_gamma));
  TRY(matrix({c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"}, {{c.vocab_size, h}}, &lm_head_,
             &final_gamma));
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    auto n = [&](const char* suffix) { return LayerTensorName(l, suffix); };
    // The norms' weights are folded into the matrices that consume the normed rows.
    std::vector<float> attn_gamma, mlp_gamma;
    TRY(t.ReadFloat(n("input_layernorm.weight"), std::vector<int64_t>{h}, &attn_gamma));
    TRY(t.ReadFloat(n("post_attention_layernorm.weight"), std::vector<int64_t>{h}, &mlp_gamma));
    TRY(matrix({n("self_attn.q_proj.weight"), n("self_attn.k_proj.weight"), n("self_attn.v_proj.weight")},
               {{qd, h}, {kvd, h}, {kvd, h}}, &L.w_qkv, &attn_gamma));
    if (c.qkv_bias) {
      TRY(vector({n("self_attn.q_proj.bias"), n("self_attn.k_proj.bias"), n("self_attn.v_proj.bias")}, {qd, kvd, kvd},
                 &L.b_qkv));
    }
    TRY(matrix({n("self_attn.o_proj.weight")}, {{h, qd}}, &L.w_o));
    if (c.o_bias) TRY(vector({n("self_attn.o_proj.bias")}, {h}, &L.b_o));
    if (c.num_experts > 0) {
      TRY(vector({n("post_attention_layernorm.weight")}, {h}, &L.mlp_norm));  // the router reads the normed rows in fp32
      TRY(vector({n("block_sparse_moe.gate.weight")}, {c.num_experts * h}, &L.w_router, {c.num_experts, h}));
      L.expert_gate_up.resize(static_cast<size_t>(c.num_experts));
      L.expert_down.resize(static_cast<size_t>(c.num_experts));
      for (int64_t e = 0; e < c.num_experts; ++e) {
        TRY(matrix({ExpertTensorName(l, e, "w1"), ExpertTensorName(l, e, "w3")}, {{f, h}, {f, h}}, &L.expert_gate_up[e],
                   &mlp_gamma, /*interleave=*/true));
        TRY(matrix({ExpertTensorName(l, e, "w2")}, {{h, f}}, &L.expert_down[e]));
      }
    } else {
      TRY(matrix({n("mlp.gate_proj.weight"), n("mlp.up_proj.weight")}, {{f, h}, {f, h}}, &L.w_gate_up, &mlp_gamma,
                 /*interleave=*/true));
      TRY(matrix({n("mlp.down_proj.weight")}, {{h, f}}, &L.w_down));
    }
  }
  const std::vector<float> inv = RopeInverseFrequencies(c);
  auto* inv_dev = arena.Take<float>(inv.size());
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_dev, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  inv_freq_ = inv_dev;
#undef TRY
  return absl::OkStatus();
}

absl::Status CudaEngine::AllocateWorkspaces() {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, f = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t R = max_rows_, L = logit_rows_, E = std::max<int64_t>(c.num_experts, 1);
  const int table_rows = options_.max_sequences + 1;
  cuda::AttentionShape shape{.rows = static_cast<int>(R), .heads = static_cast<int>(c.num_heads),
                             .splits = options_.attention_splits};
  // Inputs region: tokens, pos, row_seq [R]; logit_src [L]; params [L].
  const size_t inputs_bytes = 3 * R * 4 + L * 4 + 64 + L * sizeof(cuda::SampleParams);
  const size_t work_bytes = inputs_bytes + 256 + L * 4 + 8 + 512 + static_cast<size_t>(table_rows) * kv_.max_blocks_per_seq * 4 +
                            256 + R * h * 4 + R * h * 2 + R * (qd + 2 * kvd) * 4 + R * qd * 2 + R * 2 * f * 4 +
                            R * f * 2 + cuda::AttentionWorkspaceFloats(shape, static_cast<int>(c.head_dim)) * 4 +
                            (c.num_experts ? 2 * R * E * 4 + R * h * 4 : 0) + L * h * 2 + L * c.vocab_size * 4 +
                            (2 * static_cast<size_t>(c.num_layers) + 1) * 4 +
                            (cuda::kMaxPartials * max_bucket_ * (qd + 2 * kvd) + 2 * kDecodeKSplits * max_bucket_ * h) * 4 +
                            2 * (32 << 20) + 3 * cuda::kStreamGemmWorkspaceBytes + cuda::kAttentionBlockWorkspaceBytes +
                            64 * 256;
  absl::StatusOr<DeviceMemory> mem = DeviceAlloc(work_bytes);
  if (!mem.ok()) return mem.status();
  work_memory_ = *std::move(mem);
  memory_["workspaces"] = work_bytes;
  DeviceArena a(work_memory_.get(), work_bytes);
  buf_ = std::make_unique<Buffers>();
  Buffers& b = *buf_;
  b.inputs = a.Take<char>(inputs_bytes);
  b.inputs_bytes = inputs_bytes;
  auto* base = static_cast<char*>(b.inputs);
  size_t off = 0;
  auto place = [&](size_t bytes) {
    const size_t at = off;
    off = (off + bytes + 15) & ~size_t{15};
    return at;
  };
  const size_t o_tokens = place(R * 4), o_pos = place(R * 4), o_seq = place(R * 4), o_src = place(L * 4),
               o_params = place(L * sizeof(cuda::SampleParams));
  b.tokens = reinterpret_cast<int32_t*>(base + o_tokens);
  b.pos = reinterpret_cast<int32_t*>(base + o_pos);
  b.row_seq = reinterpret_cast<int32_t*>(base + o_seq);
  b.logit_src = reinterpret_cast<int32_t*>(base + o_src);
  b.params = reinterpret_cast<cuda::SampleParams*>(base + o_params);
  absl::StatusOr<PinnedMemory> hin = PinnedAlloc(inputs_bytes);
  if (!hin.ok()) return hin.status();
  b.host_inputs = *std::move(hin);
  absl::StatusOr<void*> mapped_in = MappedDevicePointer(b.host_inputs);
  if (!mapped_in.ok()) return mapped_in.status();
  b.mapped_inputs = *mapped_in;
  auto* hbase = static_cast<char*>(b.host_inputs.get());
  b.h_tokens = reinterpret_cast<int32_t*>(hbase + o_tokens);
  b.h_pos = reinterpret_cast<int32_t*>(hbase + o_pos);
  b.h_row_seq = reinterpret_cast<int32_t*>(hbase + o_seq);
  b.h_logit_src = reinterpret_cast<int32_t*>(hbase + o_src);
  b.h_params = reinterpret_cast<cuda::SampleParams*>(hbase + o_params);
  b.clamps_at = (L * 4 + 15) & ~size_t{15};  // 16-byte aligned for CopyBytes
  b.outputs_bytes = b.clamps_at + 8;
  auto* outputs = a.Take<char>(b.outputs_bytes);
  b.out_tokens = reinterpret_cast<int32_t*>(outputs);
  b.clamps = reinterpret_cast<unsigned long long*>(outputs + b.clamps_at);
  absl::StatusOr<PinnedMemory> hout = PinnedAlloc(b.outputs_bytes);
  if (!hout.ok()) return hout.status();
  b.host_outputs = *std::move(hout);
  absl::StatusOr<void*> mapped_out = MappedDevicePointer(b.host_outputs);
  if (!mapped_out.ok()) return mapped_out.status();
  b.graph_io.sampled = static_cast<int32_t*>(*mapped_out);
  b.graph_io.clamps = reinterpret_cast<unsigned long long*>(static_cast<char*>(*mapped_out) + b.clamps_at);
  b.block_table = a.Take<int32_t>(static_cast<size_t>(table_rows) * kv_.max_blocks_per_seq);
  absl::StatusOr<PinnedMemory> htab = PinnedAlloc(static_cast<size_t>(table_rows) * kv_.max_blocks_per_seq * 4);
  if (!htab.ok()) return htab.status();
  b.host_table = *std::move(htab);
  b.x = a.Take<float>(R * h);
  b.xn = a.Take<__half>(R * h);
  b.qkv = a.Take<float>(R * (qd + 2 * kvd));
  b.attn = a.Take<__half>(R * qd);
  b.gate_up = a.Take<float>(R * 2 * f);
  b.act = a.Take<__half>(R * f);
  b.attn_partial = a.Take<float>(cuda::AttentionWorkspaceFloats(shape, static_cast<int>(c.head_dim)));
  if (c.num_experts) {
    b.router_logits = a.Take<float>(R * E);
    b.route_weights = a.Take<float>(R * E);
    b.expert_out = a.Take<float>(R * h);
  }
  b.sumsq = a.Take<float>(2 * static_cast<size_t>(c.num_layers) + 1);
  b.final_xn = a.Take<__half>(L * h);
  b.logits = a.Take<float>(L * c.vocab_size);
  b.qkv_partials = a.Take<float>(cuda::kMaxPartials * max_bucket_ * (qd + 2 * kvd));
  b.attention_block_workspace = a.Take<char>(cuda::kAttentionBlockWorkspaceBytes);
  b.residual_partials = a.Take<float>(2 * kDecodeKSplits * max_bucket_ * h);
  b.stream_counters = a.Take<char>(3 * cuda::kStreamGemmWorkspaceBytes);
  b.cublas_workspace = a.Take<char>(b.cublas_workspace_bytes);
  b.side_cublas_workspace = a.Take<char>(b.cublas_workspace_bytes);
  if (!b.side_cublas_workspace) return absl::InternalError("cuda: workspace arena too small (a sizing bug)");
  absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> gemm =
      cuda::GemmRunner::Create(stream_.get(), b.cublas_workspace, b.cublas_workspace_bytes);
  if (!gemm.ok()) return gemm.status();
  gemm_ = *std::move(gemm);
  gemm = cuda::GemmRunner::Create(side_stream_.get(), b.side_cublas_workspace, b.cublas_workspace_bytes);
  if (!gemm.ok()) return gemm.status();
  side_gemm_ = *std::move(gemm);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b.clamps, 0, 8));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b.stream_counters, 0, 3 * cuda::kStreamGemmWorkspaceBytes));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b.attention_block_workspace, 0, cuda::kAttentionBlockWorkspaceBytes));
  // Inputs start valid (token 0 at position 0 of the trash row) so padded graph rows are harmless.
  std::memset(b.host_inputs.get(), 0, inputs_bytes);

  // KV pool: what is left, times the configured fraction.
  size_t free_bytes = 0, total_bytes = 0;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const bool scaled = kv_.dtype != KvDtype::kFp16;
  const size_t per_block_layer = static_cast<size_t>(kv_.block_size) * kv_.kv_heads *
                                 (kv_.head_dim * KvElementBytes(kv_.dtype) + (scaled ? 4 : 0)) * 2;
  const size_t per_block = per_block_layer * static_cast<size_t>(c.num_layers);
  num_blocks_ = static_cast<int64_t>(free_bytes * options_.kv_memory_fraction / per_block);
  if (num_blocks_ < 2) return absl::ResourceExhaustedError("cuda: no device memory left for the KV cache");
  const size_t kv_bytes = per_block * static_cast<size_t>(num_blocks_) + 256 * 4 * c.num_layers;
  absl::StatusOr<DeviceMemory> kv = DeviceAlloc(kv_bytes);
  if (!kv.ok()) return kv.status();
  kv_memory_ = *std::move(kv);
  memory_["kv_cache"] = kv_bytes;
  DeviceArena ka(kv_memory_.get(), kv_bytes);
  const size_t elems = static_cast<size_t>(num_blocks_) * kv_.block_size * kv_.kv_heads * kv_.head_dim;
  const size_t scales = static_cast<size_t>(num_blocks_) * kv_.block_size * kv_.kv_heads;
  for (Layer& L : layers_) {
    L.kv.k = ka.Take<char>(elems * KvElementBytes(kv_.dtype));
    L.kv.v = ka.Take<char>(elems * KvElementBytes(kv_.dtype));
    if (scaled) {
      L.kv.k_scale = ka.Take<float>(scales);
      L.kv.v_scale = ka.Take<float>(scales);
    }
    if (!L.kv.v) return absl::InternalError("cuda: KV arena too small (a sizing bug)");
  }
  // Block 0 is the trash block of padded rows; the rest are free.
  free_blocks_.clear();
  for (int64_t i = num_blocks_ - 1; i >= 1; --i) free_blocks_.push_back(static_cast<int32_t>(i));
  trash_row_ = options_.max_sequences;
  for (int r = options_.max_sequences - 1; r >= 0; --r) free_table_rows_.push_back(r);
  std::memset(b.host_table.get(), 0, static_cast<size_t>(table_rows) * kv_.max_blocks_per_seq * 4);
  table_dirty_.assign(static_cast<size_t>(table_rows), 0);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b.block_table, 0, static_cast<size_t>(table_rows) * kv_.max_blocks_per_seq * 4));
  for (int i = 0; i < max_rows_; ++i) b.h_row_seq[i] = trash_row_;
  return absl::OkStatus();
}

absl::Status CudaEngine::Forward(int rows, int logit_rows, bool decode, const GraphIo* io) {
  const ModelConfig& c = config_;
  Buffers& b = *buf_;
  cudaStream_t s = stream_.get();
  const int h = static_cast<int>(c.hidden_size), f = static_cast<int>(c.intermediate_size),
            qd = static_cast<int>(c.q_dim()), kvd = static_cast<int>(c.kv_dim()), qkvw = qd + 2 * kvd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const RowMeta meta{b.row_seq, b.pos, b.block_table};
  cuda::AttentionShape shape{.rows = rows, .heads = static_cast<int>(c.num_heads), .q_stride = qkvw,
                             .sliding_window = static_cast<int>(c.sliding_window),
                             .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)), .runs = !decode};
  const int attention_tiles = cuda::AttentionRowTiles(shape, kv_);
  shape.splits = SplitsFor(attention_tiles);
  // Each op, then (when profiling) an event named after it.
#define TRY(what, expr)                                                                          \
  do {                                                                                           \
    if (absl::Status s_ = (expr); !s_.ok()) return s_;                                           \
    if (profile_ && profile_->names.size() < profile_->events.size()) {                          \
      TAILSERVE_CUDA_RETURN_IF_ERROR(                                                            \
          cudaEventRecordWithFlags(profile_->events[profile_->names.size()].get(), s, cudaEventRecordExternal)); \
      profile_->names.push_back(what);                                                           \
    }                                                                                            \
  } while (0)
  // Batch-1 decode of a dense model: every norm, the bias, the residual adds and SwiGLU ride in the
  // Gemv epilogues (see gemv.h), 7 kernels a layer instead of 10; a norm's input sum of squares is
  // accumulated by the Gemv that writes the residual. Larger batches go through cuBLAS.
  const bool fused = rows == 1 && c.num_experts == 0 && h % 8 == 0 && qd % 8 == 0 && f % 8 == 0;
  // Decode on the tensor-core attention: the attention CTA holding the new position writes its K/V
  // to the cache, so there is no RoPE kernel (3.4 us a layer on the 8B shape). At batch 1 RoPE
  // rides in the q/k/v Gemv's epilogue; above it each attention CTA sums its row's q/k/v partials
  // and rotates its q heads and K itself (shape.rope, set a layer).
  const bool mma_decode = decode && cuda::AttentionTakesNewKv(kv_);  // the tensor-core kernel's decode
  shape.new_kv = mma_decode;
  // The attention after RoPE or q/k/v, and at batch 1 every Gemv after its predecessor,
  // start programmatically on the engine's own stream (common.cuh); not when profiling, where an
  // event sits between two ops and each is timed alone.
  shape.overlap_previous = profile_ == nullptr;
  shape.cluster_merge = mma_decode && shape.splits > 1 && shape.splits <= cuda::kMaxClusterSplits &&
                        attention_tiles * kv_.kv_heads * shape.splits <= sm_count_;
  // Decode on the tensor cores where 2 or 4 splits would need the combine kernel (8B batch 16: 4
  // splits, 512 CTAs; batch 32: 2): the splits become warps of one CTA, which merges them in
  // shared memory and writes the output itself.
  if (mma_decode && !shape.cluster_merge && (shape.splits == 2 || shape.splits == 4)) {
    shape.warps = 4 * shape.splits, shape.splits = 1;
  }
  // Decode above batch 1: q/k/v, o and down split along k (kDecodeKSplits), each chunk's output
  // an fp32 array that the attention (or RoPE) or the next norm adds; the residual's stay pending
  // until a norm.
  const bool split_k = decode && !fused && rows <= max_bucket_;
  const int64_t qkv_stride = int64_t{max_bucket_} * qkvw, residual_stride = int64_t{max_bucket_} * h;
  // Decode at attention_block_min_rows-16 rows on an FP8 cache (options_.attention_block): the
  // attention and o (and with kWhole q/k/v) in one launch, o added into the residual.
  using BlockUse = CudaEngineOptions::AttentionBlockUse;
  const bool attention_block =
      split_k && mma_decode && options_.attention_block != BlockUse::kOff && rows >= options_.attention_block_min_rows &&
      cuda::AttentionBlockTakes(rows, h, static_cast<int>(c.num_heads), kv_, shape.sliding_window).ok();
  const bool block_qkv = attention_block && options_.attention_block == BlockUse::kWhole;
  // The deepest W_o ring that leaves room for the key stages asked for (the kernel's own default
  // at 2); more than any ring allows is refused by the launch.
  int block_ring_stages = cuda::AttentionBlockArgs{}.ring_stages;
  while (block_ring_stages > 2 &&
         cuda::AttentionBlockMaxKeyStages(kv_.head_dim, block_ring_stages) < options_.attention_block_key_stages) {
    --block_ring_stages;
  }
  cuda::Partials pending;
  // Decode through cuBLASLt (above batch 1, or a model the batch-1 Gemv does not take; dense, large
  // FFN): the FFN in two halves along its width, each gate/up → SwiGLU → down over its f / 2
  // inputs, the second half on a forked branch; both write their down projection's k chunks,
  // which the next norm adds into the residual. The halves fill each other's ramps, tails and
  // SwiGLU. Measured on the H200 (bench/RESULTS.md): the 8B's FFN (352 MB) at 16 / 32 / 64 rows
  // 90.5 / 92.2 / 95.3 µs against 91.9 / 96.9 / 99.3 on one stream (kernel bench --mlp-branches);
  // the 1B's (100 MB) got slower (engine b16 1.19 → 1.22 ms): each half's GEMMs are then too short
  // to hide anything, hence the size floor (options_.ffn_halves_min_bytes). Not when profiling (one
  // event after each op on one stream; the whole-FFN shapes then run on cuBLASLt's untimed pick).
  // Or (options_.stream_ffn_chunks) at stream_ffn_min_rows-16 rows one StreamFfn launch, down's
  // k chunks the partials the next norm adds.
  int stream_ffn_chunks = 0, stream_ffn_last = 0;
  if (options_.stream_ffn_chunks > 0 && split_k && rows >= options_.stream_ffn_min_rows &&
      rows <= cuda::kStreamGemmMaxRows && c.num_experts == 0 && h % 64 == 0) {
    const int last = options_.stream_ffn_last_chunk >= 0 ? options_.stream_ffn_last_chunk : f * 5 / 28 / 256 * 256;
    for (int chunks = std::min(options_.stream_ffn_chunks, cuda::kMaxPartials); chunks >= 1 && !stream_ffn_chunks;
         chunks /= 2) {
      if (cuda::StreamFfnSplits(f, chunks, last, options_.stream_ffn_last_chunks)) {
        stream_ffn_chunks = chunks, stream_ffn_last = last;
      } else if (cuda::StreamFfnSplits(f, chunks)) {
        stream_ffn_chunks = chunks;
      }
    }
  }
  // q/k/v by StreamGemm at the rows StreamFfn takes (options_.stream_qkv_chunks): k in that many
  // chunks or fewer where k does not split, at the most 64-wide k boxes a stage that divide a
  // chunk (variants 4, 1, 0: 4, 2, 1 boxes); launched programmatically after the norm, which
  // triggers before its wait (options_.norm_trigger_first), so its W streams during the norm and
  // the FFN's last items.
  int stream_qkv_chunks = 0, stream_qkv_variant = 0;
  if (options_.stream_qkv_chunks > 0 && split_k && !block_qkv && rows >= options_.stream_ffn_min_rows &&
      rows <= cuda::kStreamGemmMaxRows) {
    for (int chunks = options_.stream_qkv_chunks; chunks >= 1 && !stream_qkv_chunks; chunks /= 2) {  // Init bounds it
      for (int variant : {4, 1, 0}) {
        if (h % (cuda::StreamGemmKStep(variant) * chunks) == 0) {
          stream_qkv_chunks = chunks, stream_qkv_variant = variant;
          break;
        }
      }
    }
  }
  const bool ffn_halves = split_k && stream_ffn_chunks == 0 && c.num_experts == 0 && f % 16 == 0 &&
                          profile_ == nullptr && 3 * int64_t{h} * f * 2 >= options_.ffn_halves_min_bytes;
  auto gemm_split_k = [&](cuda::GemmRunner& gemm, const __half* x, int k, const __half* w, int n, float* out,
                          int64_t stride, cuda::Partials* written, int ldw = 0) -> absl::Status {
    absl::StatusOr<int> chunks = gemm.RunSplitK(x, rows, k, w, n, kDecodeKSplits, out, stride, ldw);
    if (!chunks.ok()) return chunks.status();
    *written = {out, *chunks, stride};
    return absl::OkStatus();
  };
  auto sumsq = [&](size_t slot) { return b.sumsq + slot; };
  // At batch 1 the embedding writes sumsq(0) and zeroes the slots the Gemvs accumulate into (no
  // memset node in the graph).
  const int sumsq_slots = fused ? static_cast<int>(2 * layers_.size() + 1) : 0;
  // In a graph, after the kernel that copies the inputs. Reading the token ids from the host
  // mirror beside that copy ended later, not earlier (H200 CUPTI trace: the copy's end gated it
  // anyway, and its mapped read added a PCIe round trip).
  TRY("embed", cuda::EmbedRows({.table = embed_, .tokens = b.tokens, .rows = rows, .hidden = h, .x = b.x,
                                .sumsq = fused ? sumsq(0) : nullptr, .sumsq_slots = sumsq_slots}, s));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    cuda::Partials qkv_in;  // none: RoPE reads b.qkv
    if (fused) {
      cuda::GemvArgs qkv{.x_f32 = b.x, .k = h, .w = L.w_qkv, .n = qkvw, .y = b.qkv, .in_sumsq = sumsq(2 * l), .eps = eps,
                         .overlap_previous = shape.overlap_previous};
      if (shape.new_kv) {  // the bias and RoPE, which RopeWriteKv applies otherwise
        qkv.bias = L.b_qkv, qkv.rope_head_dim = kv_.head_dim, qkv.rope_cols = qd + kvd, qkv.rope_pos = b.pos;
        qkv.rope_inv_freq = inv_freq_;
      }
      TRY("gemm_qkv", cuda::Gemv(qkv, s));
    } else {
      // The weight folded into w_qkv.
      // Its follower below is StreamGemm only where stream_qkv_chunks > 0 (block_qkv excludes it).
      TRY("rmsnorm", cuda::RmsNormRows(b.x, pending, nullptr, rows, h, nullptr, eps, b.xn, s, shape.overlap_previous,
                                       (options_.norm_trigger_first & 1) && stream_qkv_chunks > 0));
      pending = {};
      if (block_qkv) {
        // q/k/v inside the block below.
      } else if (stream_qkv_chunks > 0) {
        TRY("gemm_qkv", cuda::StreamGemm({.x = b.xn, .rows = rows, .k = h, .w = L.w_qkv, .n = qkvw,
                                          .chunks = stream_qkv_chunks, .partials = b.qkv_partials,
                                          .partial_stride = qkv_stride,
                                          .workspace = b.stream_counters + (1 + l % 2) * cuda::kStreamGemmWorkspaceBytes,
                                          .overlap_previous = shape.overlap_previous, .variant = stream_qkv_variant},
                                         s));
        qkv_in = {b.qkv_partials, stream_qkv_chunks, qkv_stride};
      } else if (split_k) {
        TRY("gemm_qkv", gemm_split_k(*gemm_, b.xn, h, L.w_qkv, qkvw, b.qkv_partials, qkv_stride, &qkv_in));
      } else {
        TRY("gemm_qkv", gemm_->Run(b.xn, rows, h, L.w_qkv, qkvw, 0.0f, b.qkv));
      }
    }
    if (attention_block) {
      TRY("attention_block",
          cuda::AttentionBlock({.xn = b.xn, .rows = rows, .hidden = h, .heads = static_cast<int>(c.num_heads),
                                .w_qkv = L.w_qkv, .bias = L.b_qkv, .w_o = L.w_o, .inv_freq = inv_freq_,
                                .scale = shape.scale, .sliding_window = shape.sliding_window, .meta = meta,
                                .geometry = kv_, .layer = L.kv, .qkv = b.qkv,
                                .qkv_parts = block_qkv ? cuda::Partials{} : qkv_in, .attn = b.attn, .x = b.x,
                                .clamps = b.clamps, .workspace = b.attention_block_workspace,
                                .overlap_previous = shape.overlap_previous, .ring_stages = block_ring_stages,
                                .key_stages = options_.attention_block_key_stages,
                                .late_o_stages = options_.attention_block_late_o_stages},
                               s));
    } else if (!shape.new_kv) {
      TRY("rope_kv_write", cuda::RopeWriteKv(b.qkv, qkv_in, L.b_qkv, rows, static_cast<int>(c.num_heads), meta, kv_, L.kv,
                                             inv_freq_, b.clamps, s, shape.overlap_previous));
    } else if (!fused) {
      shape.rope = {.inv_freq = inv_freq_, .parts = qkv_in, .bias = L.b_qkv};
    }
    if (!attention_block) {
      TRY("attention", cuda::PagedAttention(b.qkv, shape, meta, kv_, L.kv, b.attn_partial, b.attn, s, b.clamps));
    }
    if (fused) {
      // o's CTAs start while the attention runs (its CTAs, or its combine, trigger before the end)
      // and copy W meanwhile.
      TRY("gemm_o", cuda::Gemv({.x = b.attn, .k = qd, .w = L.w_o, .n = h, .y = b.x, .beta = 1.0f, .bias = L.b_o,
                                .out_sumsq = sumsq(2 * l + 1), .overlap_previous = shape.overlap_previous,
                                .preload_w = shape.overlap_previous}, s));
      TRY("gemm_gate_up", cuda::Gemv({.x_f32 = b.x, .k = h, .w = L.w_gate_up, .n = 2 * f, .swiglu_out = b.act,
                                      .in_sumsq = sumsq(2 * l + 1), .eps = eps, .overlap_previous = shape.overlap_previous}, s));
      TRY("gemm_down", cuda::Gemv({.x = b.act, .k = f, .w = L.w_down, .n = h, .y = b.x, .beta = 1.0f,
                                   .out_sumsq = sumsq(2 * l + 2), .overlap_previous = shape.overlap_previous}, s));
      continue;
    }
    if (attention_block) {
      // o is in x already.
    } else if (split_k) {
      TRY("gemm_o", gemm_split_k(*gemm_, b.attn, qd, L.w_o, h, b.residual_partials, residual_stride, &pending));
    } else {
      TRY("gemm_o", gemm_->Run(b.attn, rows, qd, L.w_o, h, 1.0f, b.x));  // residual add fused into the GEMM
    }
    if (L.b_o) TRY("bias", cuda::AddBias(b.x, rows, h, L.b_o, s));
    // The weight folded into gate/up.
    TRY("rmsnorm", cuda::RmsNormRows(b.x, pending, nullptr, rows, h, nullptr, eps, b.xn, s, shape.overlap_previous,
                                     (options_.norm_trigger_first & 2) && stream_ffn_chunks > 0));
    pending = {};
    if (stream_ffn_chunks > 0) {
      TRY("ffn", cuda::StreamFfn({.x = b.xn, .rows = rows, .hidden = h, .w_gate_up = L.w_gate_up, .ffn = f,
                                  .w_down = L.w_down, .act = b.act, .chunks = stream_ffn_chunks,
                                  .lag = options_.stream_ffn_lag, .partials = b.residual_partials,
                                  .partial_stride = residual_stride, .workspace = b.stream_counters,
                                  .ctas = sm_count_ * options_.stream_ffn_ctas_per_sm,
                                  .overlap_previous = shape.overlap_previous,
                                  .k_boxes = options_.stream_ffn_k_boxes, .last_chunk = stream_ffn_last,
                                  .last_chunks = options_.stream_ffn_last_chunks,
                                  .max_ring_bytes = options_.stream_ffn_ctas_per_sm > 1 ? cuda::kStreamFfnHalfRingBytes : 0},
                                 s));
      pending = {b.residual_partials, stream_ffn_chunks, residual_stride};
    } else if (ffn_halves) {
      // Gate and up interleave, so the first f rows of w_gate_up are the first f / 2 features'.
      cudaStream_t side = side_stream_.get();
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(ffn_fork_.get(), s));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, ffn_fork_.get(), 0));
      // Each half's down projection writes its k chunks' outputs after the other's; the next norm
      // adds them all.
      cuda::Partials downs[2];
      for (int half = 0; half < 2; ++half) {
        cuda::GemmRunner& gemm = half ? *side_gemm_ : *gemm_;
        float* gate_up = b.gate_up + static_cast<size_t>(half) * rows * f;
        __half* act = b.act + static_cast<size_t>(half) * rows * (f / 2);
        TRY("gemm_gate_up", gemm.Run(b.xn, rows, h, L.w_gate_up + static_cast<size_t>(half) * f * h, f, 0.0f, gate_up));
        TRY("swiglu", cuda::SwiGlu(gate_up, rows, f / 2, act, half ? side : s, shape.overlap_previous));
        float* out = b.residual_partials + (half ? downs[0].count * residual_stride : 0);
        TRY("gemm_down", gemm_split_k(gemm, act, f / 2, L.w_down + half * (f / 2), h, out, residual_stride, &downs[half],
                                      /*ldw=*/f));
      }
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(ffn_join_.get(), side));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, ffn_join_.get(), 0));
      pending = {b.residual_partials, downs[0].count + downs[1].count, residual_stride};
    } else if (c.num_experts == 0) {
      TRY("gemm_gate_up", gemm_->Run(b.xn, rows, h, L.w_gate_up, 2 * f, 0.0f, b.gate_up));
      TRY("swiglu", cuda::SwiGlu(b.gate_up, rows, f, b.act, s, shape.overlap_previous));
      if (split_k) {
        TRY("gemm_down", gemm_split_k(*gemm_, b.act, f, L.w_down, h, b.residual_partials, residual_stride, &pending));
      } else {
        TRY("gemm_down", gemm_->Run(b.act, rows, f, L.w_down, h, 1.0f, b.x));
      }
    } else {
      // Every expert runs over every row and rows it did not route to get weight 0: wasteful
      // (experts / top_k times the FLOPs) but shape-static, so it lives in the graph.
      const int E = static_cast<int>(c.num_experts);
      TRY("moe_router", cuda::MoeRouterLogits(b.x, rows, h, L.mlp_norm, eps, L.w_router, E, b.router_logits, s));
      TRY("moe_route", cuda::MoeRoute(b.router_logits, rows, E, static_cast<int>(c.experts_per_token), b.route_weights, s));
      for (int e = 0; e < E; ++e) {
        TRY("gemm_gate_up", gemm_->Run(b.xn, rows, h, L.expert_gate_up[e], 2 * f, 0.0f, b.gate_up));
        TRY("swiglu", cuda::SwiGlu(b.gate_up, rows, f, b.act, s, shape.overlap_previous));
        TRY("gemm_down", gemm_->Run(b.act, rows, f, L.expert_down[e], h, 0.0f, b.expert_out));
        TRY("moe_combine", cuda::AddScaledRows(b.x, b.expert_out, b.route_weights + e, E, rows, h, s));
      }
    }
  }
  if (io) {
    // The clamp count is final after the last layer: a side branch copies it out while the LM
    // head streams, instead of a copy kernel after the sampler.
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_.get(), s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_stream_.get(), fork_.get(), 0));
    if (absl::Status st = cuda::CopyBytes(b.clamps, io->clamps, sizeof(*b.clamps), side_stream_.get()); !st.ok()) {
      return st;
    }
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_.get(), side_stream_.get()));
  }
  if (logit_rows > 0 && fused) {  // the final norm in the LM head's epilogue (its weight folded into lm_head_)
    TRY("lm_head", cuda::Gemv({.x_f32 = b.x, .k = h, .w = lm_head_, .n = static_cast<int>(c.vocab_size), .y = b.logits,
                               .in_sumsq = sumsq(2 * layers_.size()), .eps = eps,
                               .overlap_previous = shape.overlap_previous}, s));
  } else if (logit_rows > 0) {
    TRY("final_norm", cuda::RmsNormRows(b.x, pending, b.logit_src, logit_rows, h, nullptr, eps, b.final_xn, s));
    pending = {};
    TRY("lm_head", gemm_->Run(b.final_xn, logit_rows, h, lm_head_, static_cast<int>(c.vocab_size), 0.0f, b.logits));
  }
  if (logit_rows > 0 && decode) {
    TRY("sample", cuda::SampleRows(b.logits, logit_rows, static_cast<int>(c.vocab_size), b.params,
                                   io ? io->sampled : b.out_tokens, s, shape.overlap_previous));
  }
  if (io) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, join_.get(), 0));
#undef TRY
  return absl::OkStatus();
}

int CudaEngine::SplitsFor(int tiles) const {
  // A CTA of the attention kernel takes about kFixed + keys · kPerKey (the tensor-core kernel on
  // the H200, fitted from batch 64 at 512 and 2048 tokens with 1 and 4 splits: ~5 µs of latency
  // for q, the block table, the first tile and the merge, then ~0.035 µs a key at head_dim 128,
  // scaled by head_dim, i.e. by a key's bytes: unscaled, the 1B shape (head_dim 64, 6 CTAs an SM)
  // took 3 splits at batch 64, 1.6x slower than 1). The split count is baked into each bucket's
  // graph before contexts are known, so it minimises waves · (kFixed + keys per split · kPerKey)
  // at a design context of 1024 tokens: long CTAs amortise the latency, but a partly filled last
  // wave idles the GPU. Each split adds partials for the merge to read (batch 1 at 512 tokens:
  // 8.5 µs with 16 splits, 11.0 with 32, so ~0.14 µs a split), and more than one split needs the
  // combine kernel (~3.9 µs; one split on the tensor cores writes the output itself). At batch 1
  // the splits merge in a cluster instead (cheaper than the combine, ~1.7 µs a layer less on the
  // 8B), which the model does not price; its picks there (16 on the 8B, 11 on the 1B) still beat a
  // cap of 8 (8B 3.94 against 4.04 ms, 1B 0.85 against 0.86).
  constexpr double kFixedUs = 5.0, kPerKeyUs128 = 0.035, kPerSplitUs = 0.14, kCombineUs = 3.9;
  constexpr double kDesignContext = 1024.0;
  const double per_key_us = kPerKeyUs128 * kv_.head_dim / 128.0;
  const int ctas = tiles * kv_.kv_heads, wave = attention_wave_;
  int best = 1;
  double best_cost = 0.0;
  for (int splits = 1; splits <= options_.attention_splits; ++splits) {
    const double waves = static_cast<double>((ctas * splits + wave - 1) / wave);
    const double cost = waves * (kFixedUs + kDesignContext / splits * per_key_us) + kPerSplitUs * splits +
                        (splits > 1 ? kCombineUs : 0.0);
    if (splits == 1 || cost < best_cost) best = splits, best_cost = cost;
  }
  return best;
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> CudaEngine::ProfileDecode(int rows) {
  if (rows > max_bucket_) return absl::InvalidArgumentError("ProfileDecode: more rows than the largest bucket");
  if (absl::Status s = UseDevice(); !s.ok()) return s;
  cudaStream_t s = stream_.get();
  Profile profile;
  const size_t events = 64 + 8 * layers_.size() * (1 + 4 * std::max<size_t>(1, config_.num_experts));
  for (size_t i = 0; i < events; ++i) {
    absl::StatusOr<CudaEvent> e = MakeEvent();
    if (!e.ok()) return e.status();
    profile.events.push_back(*std::move(e));
  }
  absl::StatusOr<CudaGraphExec> graph = CaptureForward(rows, &profile);
  if (!graph.ok()) return graph.status();
  for (int rep = 0; rep < 2; ++rep) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->get(), s));  // the second is timed
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 1; i < profile.names.size(); ++i) {
    float ms = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, profile.events[i - 1].get(), profile.events[i].get()));
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == profile.names[i]; });
    if (it == out.end()) out.emplace_back(profile.names[i], ms); else it->second += ms;
  }
  return out;
}

int CudaEngine::BucketFor(int rows) const {
  auto bucket = std::lower_bound(options_.buckets.begin(), options_.buckets.end(), rows);
  return bucket == options_.buckets.end() ? rows : *bucket;
}

absl::StatusOr<double> CudaEngine::ReplayMilliseconds(int rows, int reps, bool from_idle) {
  auto graph = graphs_.find(BucketFor(rows));
  if (graph == graphs_.end() || reps < 1) return absl::InvalidArgumentError("ReplayMilliseconds: no graph for these rows");
  if (absl::Status s = UseDevice(); !s.ok()) return s;
  cudaStream_t s = stream_.get();
  double result = 0;
  if (from_idle) {
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->second.get(), s));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    result = ms[reps / 2];
  } else {
    absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
    if (!start.ok()) return start.status();
    if (!stop.ok()) return stop.status();
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), s));
    for (int i = 0; i < reps; ++i) TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->second.get(), s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop->get()));
    float ms = 0;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
    result = static_cast<double>(ms) / reps;
  }
  // The replays counted the last step's clamps again: the metric keeps the step's count.
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_->clamps, &clamps_, sizeof(clamps_), cudaMemcpyHostToDevice, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return result;
}

int64_t CudaEngine::LayerStrideBytes() const {
  if (layers_.size() < 2 || layers_[0].w_qkv == nullptr) return 0;
  auto at = [](const void* p) { return reinterpret_cast<intptr_t>(p); };
  const Layer& first = layers_[0];
  const int64_t stride = at(layers_[1].w_qkv) - at(first.w_qkv);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const int64_t offset = static_cast<int64_t>(l) * stride;
    if (at(L.w_qkv) - at(first.w_qkv) != offset || at(L.w_o) - at(first.w_o) != offset ||
        at(L.w_gate_up) - at(first.w_gate_up) != offset || at(L.w_down) - at(first.w_down) != offset) {
      return 0;
    }
  }
  return stride;
}

absl::Status CudaEngine::CaptureGraphs() {
  cudaStream_t s = stream_.get();
  // Padded rows: token 0 at position 0 of the trash row; logits row i reads row i.
  Buffers& b = *buf_;
  for (int i = 0; i < logit_rows_; ++i) b.h_logit_src[i] = i;
  if (absl::Status st = UploadInputs(); !st.ok()) return st;
  // Eager runs first, outside any capture: cuBLASLt's algorithm for every bucket's shapes is
  // timed (gemm.h) and modules load. The trash row's KV slots absorb what they write; the clamp
  // count they may raise (tuning repeats residual adds) is reset.
  gemm_->set_tuning(true);
  side_gemm_->set_tuning(true);
  if (const int64_t stride = LayerStrideBytes(); stride > 0) {
    for (cuda::GemmRunner* g : {gemm_.get(), side_gemm_.get()}) {
      g->set_tuning_layers(layers_[0].w_qkv, stride, static_cast<int>(layers_.size()));
    }
  }
  for (int bucket : options_.buckets) {
    if (bucket == 1 && max_bucket_ > 1) continue;  // no cuBLASLt shapes to time
    if (absl::Status st = Forward(bucket, bucket, true); !st.ok()) return st;
  }
  gemm_->set_tuning(false);
  side_gemm_->set_tuning(false);
  if (options_.in_situ_candidates > 1) {
    for (int bucket : options_.buckets) {
      if (bucket == 1 && max_bucket_ > 1) continue;
      if (absl::Status st = TuneInSitu(bucket); !st.ok()) return st;
    }
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemset(b.clamps, 0, sizeof(unsigned long long)));
  for (int bucket : options_.buckets) {
    absl::StatusOr<CudaGraphExec> graph = CaptureForward(bucket, nullptr);
    if (!graph.ok()) return graph.status();
    graphs_[bucket] = *std::move(graph);
  }
  return absl::OkStatus();
}

absl::StatusOr<float> CudaEngine::TimeStepGraph(int rows, int replays) {
  cudaStream_t s = stream_.get();
  absl::StatusOr<CudaGraphExec> graph = CaptureForward(rows, nullptr);
  if (!graph.ok()) return graph.status();
  absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->get(), s));  // upload and warm-up
  std::vector<float> ms(replays);
  for (float& t : ms) {
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->get(), s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), s));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop->get()));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start->get(), stop->get()));
  }
  std::nth_element(ms.begin(), ms.begin() + replays / 2, ms.end());
  return ms[replays / 2];
}

absl::Status CudaEngine::TuneInSitu(int rows) {
  // Coordinate descent, one shape at a time over its candidates with the others fixed. Few
  // candidates: each costs a capture and a few replays (8B, 6 candidates: +8 to +15 s of load).
  // Measured on the H200 (8B, 512 tokens, two rounds against the picks timed alone): batch 16
  // 4.659 / 4.659 → 4.604 / 4.615 ms, batch 64 5.366 / 5.378 → 5.349 / 5.371. The FFN halves are
  // where it moves: a gate/up timed alone may fill every SM, so the other half's waits for its
  // CTAs to leave. Trying each candidate in both halves at once first did not help (b16 4.619 /
  // 4.636 against 4.620 / 4.618, thirty-fourth session).
  constexpr int kReplays = 5;
  for (cuda::GemmRunner* g : {gemm_.get(), side_gemm_.get()}) {
    for (cuda::GemmRunner::Plan* shape : g->PlannedShapes(rows)) {
      absl::StatusOr<int> n = g->PrepareCandidates(shape, options_.in_situ_candidates);
      if (!n.ok()) return n.status();
      // Candidate 0 is the shape's current algorithm: the step as it stands.
      int best = 0;
      absl::StatusOr<float> best_ms = TimeStepGraph(rows, kReplays);
      if (!best_ms.ok()) return best_ms.status();
      for (int i = 1; i < *n; ++i) {
        if (absl::Status st = g->UseCandidate(shape, i); !st.ok()) return st;
        absl::StatusOr<float> ms = TimeStepGraph(rows, kReplays);
        if (!ms.ok()) {  // a candidate that cannot run inside a graph: skip it
          (void)cudaGetLastError();
          continue;
        }
        if (*ms < *best_ms) best = i, best_ms = ms;
      }
      if (absl::Status st = g->UseCandidate(shape, best); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaGraphExec> CudaEngine::CaptureForward(int rows, Profile* profile) {
  cudaStream_t s = stream_.get();
  cudaGraph_t graph;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  // The step's inputs and outputs travel inside the graph through the host mirrors' mapped
  // addresses: a kernel copies the inputs in, the sampler writes the sampled ids there directly,
  // a side branch copies the clamp count. No copies for the host to enqueue around each replay
  // (the block table's changed rows still go before it), and no copy-engine nodes in the graph
  // (~10 us each).
  Buffers& b = *buf_;
  absl::Status st = cuda::CopyBytes(b.mapped_inputs, b.inputs, b.inputs_bytes, s);
  if (profile && st.ok()) {
    // External records become graph nodes whose timestamps can be read after the replay.
    const cudaError_t e = cudaEventRecordWithFlags(profile->events[0].get(), s, cudaEventRecordExternal);
    if (e != cudaSuccess) st = absl::InternalError(absl::StrCat("cudaEventRecordWithFlags: ", cudaGetErrorString(e)));
    profile->names.push_back("start");
  }
  profile_ = profile;
  if (st.ok()) st = Forward(rows, rows, true, &b.graph_io);
  profile_ = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);  // always, so the stream leaves capture mode
  CudaGraph owned(end == cudaSuccess ? graph : nullptr);
  if (!st.ok()) return st;
  TAILSERVE_CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t exec;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  return CudaGraphExec(exec);
}

absl::StatusOr<CudaEngine::SeqState*> CudaEngine::StateFor(uint64_t id) {
  if (auto it = seqs_.find(id); it != seqs_.end()) return &it->second;
  if (free_table_rows_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda: more than ", options_.max_sequences, " sequences hold KV cache at once"));
  }
  SeqState& st = seqs_[id];
  st.table_row = free_table_rows_.back();
  free_table_rows_.pop_back();
  return &st;
}

absl::Status CudaEngine::UseDevice() const {
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  return absl::OkStatus();
}

absl::Status CudaEngine::EnsureBlocks(SeqState& s, int64_t positions) {
  const int64_t need = (positions + kv_.block_size - 1) / kv_.block_size;
  if (need > kv_.max_blocks_per_seq) {
    return absl::OutOfRangeError(absl::StrCat(positions, " tokens exceed the context of ", max_context_));
  }
  while (static_cast<int64_t>(s.blocks.size()) < need) {
    // Unreserved growth (a caller that did not Reserve) may only use what nobody was promised.
    if (free_blocks_.empty() || (s.reserved == 0 && static_cast<int64_t>(free_blocks_.size()) <= reserved_blocks_)) {
      return absl::ResourceExhaustedError("cuda: the KV cache is full");
    }
    const int32_t block = free_blocks_.back();
    free_blocks_.pop_back();
    if (s.reserved > 0) --s.reserved, --reserved_blocks_;  // the promise is now a block
    auto* table = static_cast<int32_t*>(buf_->host_table.get());
    table[static_cast<int64_t>(s.table_row) * kv_.max_blocks_per_seq + static_cast<int64_t>(s.blocks.size())] = block;
    s.blocks.push_back(block);
    table_dirty_[s.table_row] = 1;
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::UploadInputs() {
  if (absl::Status s = UploadTableRows(); !s.ok()) return s;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_->inputs, buf_->host_inputs.get(), buf_->inputs_bytes,
                                                 cudaMemcpyHostToDevice, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaEngine::UploadTableRows() {
  auto* table = static_cast<int32_t*>(buf_->host_table.get());
  for (size_t r = 0; r < table_dirty_.size(); ++r) {
    if (!table_dirty_[r]) continue;
    table_dirty_[r] = 0;
    const size_t off = r * static_cast<size_t>(kv_.max_blocks_per_seq);
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_->block_table + off, table + off, kv_.max_blocks_per_seq * 4,
                                                   cudaMemcpyHostToDevice, stream_.get()));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::DownloadOutputs() {
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_->host_outputs.get(), buf_->out_tokens, buf_->outputs_bytes,
                                                 cudaMemcpyDeviceToHost, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaEngine::Reserve(uint64_t id, int64_t max_tokens) {
  const int64_t need = (max_tokens + kv_.block_size - 1) / kv_.block_size;
  if (need > num_blocks_ - 1) {  // block 0 is never handed out
    return absl::InvalidArgumentError(absl::StrCat("KV cache: ", max_tokens, " tokens need ", need,
                                                   " blocks, more than the whole cache holds (", num_blocks_ - 1,
                                                   "); lower max_tokens"));
  }
  if (need > static_cast<int64_t>(free_blocks_.size()) - reserved_blocks_) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: ", need, " blocks needed, ",
                                                     static_cast<int64_t>(free_blocks_.size()) - reserved_blocks_,
                                                     " free"));
  }
  absl::StatusOr<SeqState*> st = StateFor(id);
  if (!st.ok()) return st.status();
  (*st)->reserved += need;
  reserved_blocks_ += need;
  return absl::OkStatus();
}

void CudaEngine::Release(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  reserved_blocks_ -= it->second.reserved;
  for (int32_t b : it->second.blocks) free_blocks_.push_back(b);
  if (it->second.table_row >= 0) free_table_rows_.push_back(it->second.table_row);
  seqs_.erase(it);
}

absl::Status CudaEngine::Prefill(std::span<const StepSequence> batch) {
  // Rows: every uncached token but each sequence's last (the decode graph takes that one).
  Buffers& b = *buf_;
  int rows = 0;
  auto flush = [&]() -> absl::Status {
    if (rows == 0) return absl::OkStatus();
    if (absl::Status s = UploadInputs(); !s.ok()) return s;
    if (absl::Status s = Forward(rows, 0, false); !s.ok()) return s;
    // The host mirror is rewritten for the next chunk: wait until this one has been read.
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    rows = 0;
    return absl::OkStatus();
  };
  for (const StepSequence& seq : batch) {
    absl::StatusOr<SeqState*> state = StateFor(seq.id);
    if (!state.ok()) return state.status();
    SeqState& st = **state;
    const int64_t n = static_cast<int64_t>(seq.tokens->size());
    st.cached = std::min<int64_t>(st.cached, seq.computed);
    if (absl::Status s = EnsureBlocks(st, n); !s.ok()) return s;
    for (int64_t p = st.cached; p < n - 1; ++p) {
      b.h_tokens[rows] = (*seq.tokens)[p];
      b.h_pos[rows] = static_cast<int32_t>(p);
      b.h_row_seq[rows] = st.table_row;
      if (++rows == max_rows_) {
        if (absl::Status s = flush(); !s.ok()) return s;
      }
    }
    st.cached = std::max<int64_t>(st.cached, n - 1);
  }
  return flush();
}

absl::Status CudaEngine::DecodeChunk(std::span<const StepSequence> batch, size_t first, size_t count,
                                     std::vector<int32_t>* next) {
  Buffers& b = *buf_;
  const int n = static_cast<int>(count);
  const int bucket = BucketFor(n);
  for (int i = 0; i < bucket; ++i) {
    b.h_logit_src[i] = i;
    if (i >= n) {  // padding: harmless row in the trash block
      b.h_tokens[i] = 0, b.h_pos[i] = 0, b.h_row_seq[i] = trash_row_;
      b.h_params[i] = {};
      continue;
    }
    const StepSequence& seq = batch[first + i];
    const SeqState& st = seqs_.at(seq.id);
    const int64_t last = static_cast<int64_t>(seq.tokens->size()) - 1;
    b.h_tokens[i] = (*seq.tokens)[last];
    b.h_pos[i] = static_cast<int32_t>(last);
    b.h_row_seq[i] = st.table_row;
    const Sampling& sp = *seq.sampling;
    b.h_params[i] = {.temperature = sp.temperature, .top_p = sp.top_p, .top_k = sp.top_k, .unused = 0,
                     .seed = sp.seed, .position = last + 1};
  }
  cudaStream_t s = stream_.get();
  auto graph = graphs_.find(bucket);
  if (graph != graphs_.end()) {  // the graph uploads the inputs and downloads the outputs itself
    if (absl::Status st = UploadTableRows(); !st.ok()) return st;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->second.get(), s));
    ++graph_replays_;
  } else {
    if (absl::Status st = UploadInputs(); !st.ok()) return st;
    if (absl::Status st = Forward(bucket, bucket, true); !st.ok()) return st;
    if (absl::Status st = DownloadOutputs(); !st.ok()) return st;
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  const auto* out = static_cast<const char*>(b.host_outputs.get());
  std::memcpy(next->data() + first, out, static_cast<size_t>(n) * 4);
  std::memcpy(&clamps_, out + b.clamps_at, 8);
  for (int i = 0; i < n; ++i) {
    SeqState& st = seqs_.at(batch[first + i].id);
    st.cached = static_cast<int64_t>(batch[first + i].tokens->size());
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) {
  if (absl::Status s = UseDevice(); !s.ok()) return s;
  for (const StepSequence& s : batch) {
    if (static_cast<int64_t>(s.tokens->size()) > max_context_) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", s.id, ": ", s.tokens->size(),
                                                " tokens exceed the model's context of ", max_context_));
    }
  }
  if (absl::Status s = Prefill(batch); !s.ok()) return s;
  next->resize(batch.size());
  for (size_t first = 0; first < batch.size(); first += static_cast<size_t>(max_bucket_)) {
    const size_t count = std::min(batch.size() - first, static_cast<size_t>(max_bucket_));
    if (absl::Status s = DecodeChunk(batch, first, count, next); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::ForwardAllLogits(std::span<const int32_t> tokens, std::vector<float>* logits) {
  const int n = static_cast<int>(tokens.size());
  if (n > logit_rows_ || n > max_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardAllLogits: ", n, " tokens; at most ", logit_rows_));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardAllLogits: token id ", t, " outside the vocabulary"));
    }
  }
  if (absl::Status s = UseDevice(); !s.ok()) return s;
  const uint64_t id = ~0ull - 1;
  absl::StatusOr<SeqState*> state = StateFor(id);
  if (!state.ok()) return state.status();
  SeqState& st = **state;
  if (absl::Status s = EnsureBlocks(st, n); !s.ok()) {
    Release(id);
    return s;
  }
  Buffers& b = *buf_;
  for (int i = 0; i < n; ++i) {
    b.h_tokens[i] = tokens[i];
    b.h_pos[i] = i;
    b.h_row_seq[i] = st.table_row;
    b.h_logit_src[i] = i;
  }
  cudaStream_t s = stream_.get();
  absl::Status result = UploadInputs();
  if (result.ok()) result = Forward(n, n, false);
  if (result.ok()) {
    logits->resize(static_cast<size_t>(n) * config_.vocab_size);
    const cudaError_t e1 = cudaMemcpyAsync(logits->data(), b.logits, logits->size() * 4, cudaMemcpyDeviceToHost, s);
    const cudaError_t e2 = cudaStreamSynchronize(s);
    if (e1 != cudaSuccess || e2 != cudaSuccess) result = absl::InternalError(cudaGetErrorString(e1 ? e1 : e2));
  }
  for (int i = 0; i < n; ++i) b.h_row_seq[i] = trash_row_;
  Release(id);
  return result;
}

std::optional<EngineStats> CudaEngine::stats() const {
  return EngineStats{.kv_blocks_total = num_blocks_ - 1,
                     .kv_blocks_free = static_cast<int64_t>(free_blocks_.size()) - reserved_blocks_,
          .kv_clamps = clamps_, .graph_replays = graph_replays_};
}

}  // namespace tailserve
