#include "worker/backends/cuda/cuda_engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/kernels/attention_block.h"
#include "worker/backends/cuda/kernels/gemv.h"
#include "worker/backends/cuda/kernels/logprobs.h"
#include "worker/backends/cuda/plan/stream_layout.h"
#include "worker/engine/kv_dtype.h"

namespace tailserve {

static_assert(cuda::kMaxLogprobAlternatives == kMaxTopLogprobs, "the kernel lists as many alternatives as a request may ask");

CudaEngine::CudaEngine(const CudaEngineOptions& options) : options_(options) {}

CudaEngine::~CudaEngine() {
  if (streams_.main) cudaStreamSynchronize(streams_.main.get());
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Load(const std::string& dir, const CudaEngineOptions& options) {
  TAILSERVE_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(dir));
  std::unique_ptr<CudaEngine> e(new CudaEngine(options));
  e->model_id_ = std::filesystem::path(dir).lexically_normal().filename().string();
  TAILSERVE_RETURN_IF_ERROR(e->Init(ckpt));
  return e;
}

absl::Status CudaEngine::Init(const Checkpoint& ckpt) {
  config_ = ckpt.config;
  const ModelConfig& c = config_;
  const cuda::DecodeTuning& t = options_.tuning;
  if (options_.buckets.empty()) return absl::InvalidArgumentError("cuda: at least one batch bucket is needed");
  TAILSERVE_RETURN_IF_ERROR(cuda::ValidateDecodeTuning(t));
  std::sort(options_.buckets.begin(), options_.buckets.end());
  max_bucket_ = options_.buckets.back();
  max_rows_ = std::max(options_.prefill_chunk, max_bucket_);
  logit_rows_ = std::max(options_.logits_rows, max_bucket_);
  max_context_ = static_cast<int32_t>(options_.max_context > 0 ? std::min<int64_t>(options_.max_context, c.max_position)
                                                               : c.max_position);
  kv_ = {.block_size = options_.block_size,
         .kv_heads = static_cast<int32_t>(c.num_kv_heads),
         .head_dim = static_cast<int32_t>(c.head_dim),
         .max_blocks_per_seq = (max_context_ + options_.block_size - 1) / options_.block_size,
         .dtype = options_.kv_dtype};
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));

  // What the plans need: the model, and what this device and the kernels allow.
  plan_model_ = {.hidden = static_cast<int>(c.hidden_size),
                 .ffn = static_cast<int>(c.intermediate_size),
                 .heads = static_cast<int>(c.num_heads),
                 .kv_heads = static_cast<int>(c.num_kv_heads),
                 .head_dim = static_cast<int>(c.head_dim),
                 .experts = static_cast<int>(c.num_experts),
                 .sliding_window = static_cast<int>(c.sliding_window),
                 .kv_dtype = options_.kv_dtype};
  TAILSERVE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&limits_.sm_count, cudaDevAttrMultiProcessorCount, options_.device));
  TAILSERVE_ASSIGN_OR_RETURN(const int per_sm, cuda::AttentionCtasPerSm({.heads = plan_model_.heads}, kv_));
  limits_.attention_wave = per_sm * limits_.sm_count;
  for (int rows = 1; rows <= cuda::kStreamGemmMaxRows; ++rows) {
    if (cuda::AttentionBlockTakes(rows, plan_model_.hidden, plan_model_.heads, kv_, plan_model_.sliding_window).ok()) {
      limits_.attention_block_max_rows = rows;
    }
  }
  TAILSERVE_RETURN_IF_ERROR(cuda::GemvWave().status());
  for (int bucket : options_.buckets) {
    decode_plans_[bucket] = Plan(bucket, /*decode=*/true);
    spdlog::info("cuda plan: {}", decode_plans_[bucket].Describe(plan_model_));
  }

  TAILSERVE_ASSIGN_OR_RETURN(streams_, cuda::StepStreams::Create());
  TAILSERVE_ASSIGN_OR_RETURN(weights_, cuda::LoadModelWeights(ckpt));
  memory_["weights"] = weights_.bytes;
  const int table_rows = options_.max_sequences + 1;
  TAILSERVE_ASSIGN_OR_RETURN(buf_, cuda::AllocateWorkspaces(c, kv_,
                                                            {.max_rows = max_rows_,
                                                             .logit_rows = logit_rows_,
                                                             .max_bucket = max_bucket_,
                                                             .table_rows = table_rows,
                                                             .attention_splits = t.attention_splits},
                                                            /*trash_row=*/options_.max_sequences));
  memory_["workspaces"] = buf_->bytes;
  TAILSERVE_ASSIGN_OR_RETURN(
      gemm_, cuda::GemmRunner::Create(streams_.main.get(), buf_->cublas_workspace, buf_->cublas_workspace_bytes));
  TAILSERVE_ASSIGN_OR_RETURN(side_gemm_, cuda::GemmRunner::Create(streams_.side.get(), buf_->side_cublas_workspace,
                                                                  buf_->cublas_workspace_bytes));
  // The KV pool takes what is left, times the configured fraction.
  TAILSERVE_ASSIGN_OR_RETURN(pool_, cuda::AllocateKvPool(c, kv_, options_.kv_memory_fraction, options_.max_kv_blocks));
  memory_["kv_cache"] = pool_.bytes;
  // The salt keeps blocks of another model or KV format (the CPU engine's, another worker's) from
  // ever matching: the router's index holds every worker's hashes.
  std::optional<uint64_t> salt;
  if (options_.prefix_caching) {
    salt = BlockHashSalt(std::string_view(absl::StrCat("cuda|", model_id_, "|", c.vocab_size, "|", c.num_layers, "|",
                                                       KvDtypeName(kv_.dtype), "|", kv_.block_size)));
  }
  blocks_ = std::make_unique<KvBlockAllocator>(
      pool_.num_blocks, kv_.block_size, kv_.max_blocks_per_seq, options_.max_sequences, max_context_,
      std::span<int32_t>(static_cast<int32_t*>(buf_->host_table.get()),
                         static_cast<size_t>(table_rows) * kv_.max_blocks_per_seq),
      salt);
  forward_ = std::make_unique<cuda::ForwardPass>(c, kv_, weights_, pool_, *buf_, streams_, *gemm_, *side_gemm_);
  graphs_ =
      std::make_unique<cuda::DecodeGraphs>(*forward_, *buf_, streams_.main.get(), *gemm_, *side_gemm_, decode_plans_);
  if (options_.use_graphs) {
    // Padded rows: token 0 at position 0 of the trash row; logits row i reads row i.
    for (int i = 0; i < logit_rows_; ++i) buf_->h_logit_src[i] = i;
    TAILSERVE_RETURN_IF_ERROR(UploadInputs());
    TAILSERVE_RETURN_IF_ERROR(
        graphs_->CaptureAll(t.in_situ_candidates, weights_.layers.empty() ? nullptr : weights_.layers[0].w_qkv,
                            weights_.LayerStrideBytes(), static_cast<int>(weights_.layers.size())));
  }
  return absl::OkStatus();
}

cuda::StepPlan CudaEngine::Plan(int rows, bool decode, bool profiling) const {
  return cuda::PlanStep(rows, decode, plan_model_, limits_, options_.tuning, max_bucket_, profiling);
}

cuda::StepPlan CudaEngine::DecodePlan(int rows) const {
  auto it = decode_plans_.find(BucketFor(rows));
  return it != decode_plans_.end() ? it->second : Plan(rows, /*decode=*/true);
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> CudaEngine::ProfileDecode(int rows) {
  if (rows > max_bucket_) return absl::InvalidArgumentError("ProfileDecode: more rows than the largest bucket");
  TAILSERVE_RETURN_IF_ERROR(UseDevice());
  const size_t events = 64 + 8 * weights_.layers.size() * (1 + 4 * std::max<size_t>(1, config_.num_experts));
  return graphs_->Profile(Plan(rows, /*decode=*/true, /*profiling=*/true), events);
}

int CudaEngine::BucketFor(int rows) const {
  auto bucket = std::lower_bound(options_.buckets.begin(), options_.buckets.end(), rows);
  return bucket == options_.buckets.end() ? rows : *bucket;
}

absl::StatusOr<double> CudaEngine::ReplayMilliseconds(int rows, int reps, bool from_idle) {
  TAILSERVE_RETURN_IF_ERROR(UseDevice());
  TAILSERVE_ASSIGN_OR_RETURN(const double ms, graphs_->ReplayMilliseconds(BucketFor(rows), reps, from_idle));
  // The replays counted the last step's clamps again: the metric keeps the step's count.
  cudaStream_t s = streams_.main.get();
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_->clamps, &clamps_, sizeof(clamps_), cudaMemcpyHostToDevice, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return ms;
}

absl::Status CudaEngine::UseDevice() const {
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  return absl::OkStatus();
}

absl::Status CudaEngine::UploadInputs() {
  TAILSERVE_RETURN_IF_ERROR(UploadTableRows());
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_->inputs, buf_->host_inputs.get(), buf_->inputs_bytes,
                                                 cudaMemcpyHostToDevice, streams_.main.get()));
  return absl::OkStatus();
}

absl::Status CudaEngine::UploadTableRows() {
  const auto* table = static_cast<const int32_t*>(buf_->host_table.get());
  const size_t row_entries = static_cast<size_t>(kv_.max_blocks_per_seq);
  cudaError_t error = cudaSuccess;
  blocks_->TakeDirtyRows([&](int row) {
    const size_t off = static_cast<size_t>(row) * row_entries;
    if (error == cudaSuccess) {
      error = cudaMemcpyAsync(buf_->block_table + off, table + off, row_entries * 4, cudaMemcpyHostToDevice,
                              streams_.main.get());
    }
  });
  TAILSERVE_CUDA_RETURN_IF_ERROR(error);
  return absl::OkStatus();
}

absl::Status CudaEngine::DownloadOutputs() {
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_->host_outputs.get(), buf_->out_tokens, buf_->outputs_bytes,
                                                 cudaMemcpyDeviceToHost, streams_.main.get()));
  return absl::OkStatus();
}

absl::Status CudaEngine::Reserve(uint64_t id, int64_t max_tokens) { return blocks_->Reserve(id, max_tokens); }

void CudaEngine::Release(uint64_t id) { blocks_->Release(id); }

absl::StatusOr<int32_t> CudaEngine::AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens) {
  if (!blocks_->prefix_caching()) return 0;
  TAILSERVE_ASSIGN_OR_RETURN(const int64_t hit, blocks_->AttachCachedPrefix(id, tokens));
  return static_cast<int32_t>(hit);
}

absl::Status CudaEngine::Prefill(std::span<const StepSequence> batch) {
  // Rows: every uncached token but each sequence's last (the decode graph takes that one).
  cuda::Workspaces& b = *buf_;
  int rows = 0;
  auto flush = [&]() -> absl::Status {
    if (rows == 0) return absl::OkStatus();
    TAILSERVE_RETURN_IF_ERROR(UploadInputs());
    TAILSERVE_RETURN_IF_ERROR(forward_->Run(Plan(rows, /*decode=*/false), /*logit_rows=*/0));
    // The host mirror is rewritten for the next chunk: wait until this one has been read.
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.main.get()));
    rows = 0;
    return absl::OkStatus();
  };
  for (const StepSequence& seq : batch) {
    TAILSERVE_ASSIGN_OR_RETURN(KvBlockAllocator::Sequence * st, blocks_->Acquire(seq.id));
    // A prefill chunk computes tokens up to its end; otherwise all but the last, which the decode
    // graph takes.
    const int64_t n = static_cast<int64_t>(seq.tokens->size());
    const int64_t stop = seq.chunk() ? seq.end : n - 1;
    st->cached = std::min<int64_t>(st->cached, seq.computed);
    TAILSERVE_RETURN_IF_ERROR(blocks_->EnsurePositions(*st, seq.chunk() ? stop : n));
    for (int64_t p = st->cached; p < stop; ++p) {
      b.h_tokens[rows] = (*seq.tokens)[p];
      b.h_pos[rows] = static_cast<int32_t>(p);
      b.h_row_seq[rows] = st->table_row;
      if (++rows == max_rows_) TAILSERVE_RETURN_IF_ERROR(flush());
    }
    st->cached = std::max<int64_t>(st->cached, stop);
  }
  TAILSERVE_RETURN_IF_ERROR(flush());
  // Published only once computed: a block is shared from the moment it is in the index, and
  // everything here runs on one stream, so a later step that attaches it reads it after it is written.
  for (const StepSequence& seq : batch) {
    KvBlockAllocator::Sequence* st = blocks_->Find(seq.id);
    blocks_->PublishComputed(*st, *seq.tokens, st->cached);
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::DecodeChunk(std::span<const StepSequence> batch, size_t first, size_t count,
                                     std::vector<int32_t>* next) {
  cuda::Workspaces& b = *buf_;
  const int n = static_cast<int>(count);
  const int bucket = BucketFor(n);
  bool logprobs = false;
  for (int i = 0; i < bucket; ++i) {
    b.h_logit_src[i] = i;
    if (i >= n) {  // padding: harmless row in the trash block
      b.h_tokens[i] = 0, b.h_pos[i] = 0, b.h_row_seq[i] = blocks_->trash_row();
      b.h_params[i] = {};
      continue;
    }
    const StepSequence& seq = batch[first + i];
    const KvBlockAllocator::Sequence* st = blocks_->Find(seq.id);
    const int64_t last = static_cast<int64_t>(seq.tokens->size()) - 1;
    b.h_tokens[i] = (*seq.tokens)[last];
    b.h_pos[i] = static_cast<int32_t>(last);
    b.h_row_seq[i] = st->table_row;
    const Sampling& sp = *seq.sampling;
    logprobs |= seq.logprobs != nullptr;
    b.h_params[i] = {.temperature = sp.temperature,
                     .top_p = sp.top_p,
                     .top_k = sp.top_k,
                     .logprobs = sp.top_logprobs >= 0 ? 1 + sp.top_logprobs : 0,
                     .seed = sp.seed,
                     .position = last + 1};
  }
  cudaStream_t s = streams_.main.get();
  if (cudaGraphExec_t graph = graphs_->Find(bucket)) {  // the graph uploads the inputs and downloads the outputs itself
    TAILSERVE_RETURN_IF_ERROR(UploadTableRows());
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph, s));
    ++graph_replays_;
  } else {
    TAILSERVE_RETURN_IF_ERROR(UploadInputs());
    TAILSERVE_RETURN_IF_ERROR(forward_->Run(DecodePlan(bucket), bucket));
    TAILSERVE_RETURN_IF_ERROR(DownloadOutputs());
  }
  if (logprobs) {  // outside the graph: only the steps that asked pay for the copy
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.host_logprobs.get(), b.logprobs,
                                                   static_cast<size_t>(n) * sizeof(cuda::RowLogprobs),
                                                   cudaMemcpyDeviceToHost, s));
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  const auto* out = static_cast<const char*>(b.host_outputs.get());
  std::memcpy(next->data() + first, out, static_cast<size_t>(n) * 4);
  std::memcpy(&clamps_, out + b.clamps_at, 8);
  const auto* rows = static_cast<const cuda::RowLogprobs*>(b.host_logprobs.get());
  for (int i = 0; i < n; ++i) {
    const StepSequence& seq = batch[first + i];
    if (seq.logprobs) {
      seq.logprobs->logprob = rows[i].logprob;
      seq.logprobs->top.clear();
      for (int k = 0; k < rows[i].count; ++k) seq.logprobs->top.emplace_back(rows[i].ids[k], rows[i].values[k]);
    }
    KvBlockAllocator::Sequence* st = blocks_->Find(seq.id);
    st->cached = static_cast<int64_t>(seq.tokens->size());
    blocks_->PublishComputed(*st, *seq.tokens, st->cached);
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) {
  TAILSERVE_RETURN_IF_ERROR(UseDevice());
  for (const StepSequence& s : batch) {
    TAILSERVE_RETURN_IF_ERROR(CheckChunk(s));
    if (static_cast<int64_t>(s.tokens->size()) > max_context_) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", s.id, ": ", s.tokens->size(),
                                                " tokens exceed the model's context of ", max_context_));
    }
  }
  TAILSERVE_RETURN_IF_ERROR(Prefill(batch));
  // Prefill chunks sample nothing: the decode graphs run the other sequences alone.
  std::vector<StepSequence> decoding;
  std::vector<size_t> decoding_at;
  const bool chunks = std::any_of(batch.begin(), batch.end(), [](const StepSequence& s) { return s.chunk(); });
  if (chunks) {
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].chunk()) decoding.push_back(batch[i]), decoding_at.push_back(i);
    }
  }
  const std::span<const StepSequence> decode = chunks ? std::span<const StepSequence>(decoding) : batch;
  std::vector<int32_t> sampled;
  std::vector<int32_t>* out = chunks ? &sampled : next;
  out->resize(decode.size());
  for (size_t first = 0; first < decode.size(); first += static_cast<size_t>(max_bucket_)) {
    const size_t count = std::min(decode.size() - first, static_cast<size_t>(max_bucket_));
    TAILSERVE_RETURN_IF_ERROR(DecodeChunk(decode, first, count, out));
  }
  if (chunks) {
    next->assign(batch.size(), -1);
    for (size_t j = 0; j < decoding_at.size(); ++j) (*next)[decoding_at[j]] = sampled[j];
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::ForwardAllLogits(std::span<const int32_t> tokens, std::vector<float>* logits) {
  return TeacherForced(tokens, /*through_cache=*/false, logits).status();
}

absl::StatusOr<int32_t> CudaEngine::ForwardLogitsThroughCache(std::span<const int32_t> tokens,
                                                              std::vector<float>* logits) {
  return TeacherForced(tokens, /*through_cache=*/true, logits);
}

absl::StatusOr<int32_t> CudaEngine::TeacherForced(std::span<const int32_t> tokens, bool through_cache,
                                                  std::vector<float>* logits) {
  const int n = static_cast<int>(tokens.size());
  for (int32_t t : tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardAllLogits: token id ", t, " outside the vocabulary"));
    }
  }
  TAILSERVE_RETURN_IF_ERROR(UseDevice());
  const uint64_t id = ~0ull - 1;
  int first = 0;
  if (through_cache) {
    TAILSERVE_ASSIGN_OR_RETURN(first, AttachCachedPrefix(id, tokens));
  }
  const int rows = n - first;
  if (rows > logit_rows_ || rows > max_rows_) {
    Release(id);
    return absl::InvalidArgumentError(absl::StrCat("ForwardAllLogits: ", rows, " tokens; at most ", logit_rows_));
  }
  absl::StatusOr<KvBlockAllocator::Sequence*> acquired = blocks_->Acquire(id);
  if (!acquired.ok()) return acquired.status();
  KvBlockAllocator::Sequence* st = *acquired;
  if (absl::Status s = blocks_->EnsurePositions(*st, n); !s.ok()) {
    Release(id);
    return s;
  }
  cuda::Workspaces& b = *buf_;
  for (int i = 0; i < rows; ++i) {
    b.h_tokens[i] = tokens[first + i];
    b.h_pos[i] = first + i;
    b.h_row_seq[i] = st->table_row;
    b.h_logit_src[i] = i;
  }
  cudaStream_t s = streams_.main.get();
  absl::Status result = UploadInputs();
  if (result.ok()) result = forward_->Run(Plan(rows, /*decode=*/false), rows);
  if (result.ok()) {
    logits->resize(static_cast<size_t>(rows) * config_.vocab_size);
    const cudaError_t e1 = cudaMemcpyAsync(logits->data(), b.logits, logits->size() * 4, cudaMemcpyDeviceToHost, s);
    const cudaError_t e2 = cudaStreamSynchronize(s);
    if (e1 != cudaSuccess || e2 != cudaSuccess) result = absl::InternalError(cudaGetErrorString(e1 ? e1 : e2));
  }
  if (result.ok() && through_cache) {
    st->cached = n;
    blocks_->PublishComputed(*st, tokens, n);
  }
  for (int i = 0; i < rows; ++i) b.h_row_seq[i] = blocks_->trash_row();
  Release(id);
  if (!result.ok()) return result;
  return first;
}

std::optional<EngineStats> CudaEngine::stats() const {
  return EngineStats{.kv_blocks_total = blocks_->usable_blocks(),
                     .kv_blocks_free = blocks_->unpromised_blocks(),
                     .kv_blocks_cached = blocks_->cached_blocks(),
                     .kv_evictions = blocks_->evictions(),
                     .kv_clamps = clamps_,
                     .graph_replays = graph_replays_};
}

}  // namespace tailserve
