#pragma once
// The GPU backend: fp16 weights and activations (fp32 residual stream and accumulation), a paged
// KV cache (FP8 E4M3 by default) and one CUDA graph replay per decode step. Everything on the
// device is allocated once in Load(): weights (weights.h), workspaces and the KV block pool
// (workspaces.h), and the graphs, captured for each batch-size bucket (decode_graphs.h) from the
// bucket's plan (plan/decode_plan.h, logged at load). A step runs the prefill of new tokens
// eagerly in chunks (all but each sequence's last token), then the last token of every sequence
// through the graph of the smallest bucket that fits; sampling happens on the GPU and only token
// ids come back. This class is the Engine facade over those parts and the KV block allocator.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "worker/backends/cuda/decode_graphs.h"
#include "worker/backends/cuda/forward.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/plan/decode_plan.h"
#include "worker/kv/kv_block_allocator.h"
#include "worker/backends/cuda/weights.h"
#include "worker/backends/cuda/workspaces.h"
#include "worker/engine/engine.h"

namespace tailserve {

// What a deployment sets (worker config) and what the tests and benchmarks size differently.
struct CudaEngineOptions {
  KvDtype kv_dtype = KvDtype::kFp8E4M3;
  double kv_memory_fraction = 0.9;  // of the device memory left after weights and workspaces
  int block_size = 16;
  std::vector<int> buckets = {1, 2, 4, 8, 16, 32, 64, 128};  // decode graphs
  int prefill_chunk = 2048;  // tokens per eager prefill forward
  int max_sequences = 256;   // sequences holding KV at once
  int max_context = 0;       // 0: the model's max_position_embeddings
  int logits_rows = 0;       // rows whose logits one forward can produce (0: the largest bucket)
  bool use_graphs = true;
  int device = 0;
  // Automatic prefix caching (worker.prefix_caching): full blocks are published under their
  // chained hash and reused by later sequences; the FP8 scales sit beside each block's data.
  bool prefix_caching = false;
  int64_t max_kv_blocks = 0;  // a cap on the pool's blocks (0: the memory fraction alone decides)
  // The decode path's tuning: its defaults are what the worker runs (plan/decode_plan.h).
  cuda::DecodeTuning tuning;
};

class CudaEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Load(const std::string& dir, const CudaEngineOptions& options);
  ~CudaEngine() override;

  std::string backend() const override { return "cuda"; }
  std::string model_id() const override { return model_id_; }
  bool simulated() const override { return false; }
  int32_t vocab_size() const override { return static_cast<int32_t>(config_.vocab_size); }
  int32_t max_context() const override { return max_context_; }
  std::vector<int32_t> eos_token_ids() const override { return config_.eos_token_ids; }
  absl::Status Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) override;
  absl::Status Reserve(uint64_t id, int64_t max_tokens) override;
  void Release(uint64_t id) override;
  absl::StatusOr<int32_t> AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens) override;
  const KvEventLog* kv_events() const override { return blocks_->events(); }

  // Teacher-forced logits of one sequence (a fresh one, released afterwards): [tokens, vocab].
  absl::Status ForwardAllLogits(std::span<const int32_t> tokens, std::vector<float>* logits);
  // The same through the prefix cache: the fresh sequence attaches the cached blocks `tokens`
  // begin with, computes the rest and publishes its full blocks before it is released. Returns
  // the positions attached, h; `logits` holds the computed positions' rows, [tokens - h, vocab].
  absl::StatusOr<int32_t> ForwardLogitsThroughCache(std::span<const int32_t> tokens, std::vector<float>* logits);
  std::optional<EngineStats> stats() const override;
  const ModelConfig& config() const { return config_; }
  const CudaEngineOptions& options() const { return options_; }
  // The plan of the decode bucket that holds `rows` rows: its path decisions, and their log line.
  cuda::StepPlan DecodePlan(int rows) const;
  std::string DescribeDecodePlan(int rows) const { return DecodePlan(rows).Describe(plan_model_); }
  // The decode forward of `rows` rows (the inputs of the last step), captured with an event after
  // every op and replayed as a graph: milliseconds per op kind, summed over layers, in the order
  // first seen (the benchmark's breakdown; graph replay keeps launch gaps out of the numbers).
  absl::StatusOr<std::vector<std::pair<std::string, double>>> ProfileDecode(int rows);
  // Milliseconds of device time per replay of the decode graph for `rows` rows, replayed `reps`
  // times back to back on the inputs of the last step (each writes the same K/V to the same slots
  // and samples the same tokens; the clamp count is put back): a step without the host's round
  // trip between steps, which the benchmark reports beside Step()'s time. `from_idle`: the
  // median host time from each launch to its synchronize returning, the GPU idle before each (a
  // Step() without its bookkeeping), which splits that round trip into the launch from idle and
  // Step()'s own host work.
  absl::StatusOr<double> ReplayMilliseconds(int rows, int reps, bool from_idle = false);
  // Device memory taken at start, by purpose (bytes).
  const std::map<std::string, size_t>& memory() const { return memory_; }

 private:
  explicit CudaEngine(const CudaEngineOptions& options);
  absl::Status Init(const Checkpoint& ckpt);
  // The device this engine runs on, made current on the calling thread: the scheduler's thread
  // steps the engine, not the one that loaded it, and the current device is per thread.
  absl::Status UseDevice() const;
  // Copies the step inputs (and block-table rows changed since the last upload) to the device.
  absl::Status UploadInputs();
  // Only the block-table rows: a decode graph copies the inputs itself.
  absl::Status UploadTableRows();
  // Copies the sampled tokens and the clamp count to the pinned host mirror (not synchronised).
  absl::Status DownloadOutputs();
  absl::Status Prefill(std::span<const StepSequence> batch);
  absl::Status DecodeChunk(std::span<const StepSequence> batch, size_t first, size_t count, std::vector<int32_t>* next);
  absl::StatusOr<int32_t> TeacherForced(std::span<const int32_t> tokens, bool through_cache, std::vector<float>* logits);
  // The smallest decode bucket holding `rows` rows (`rows` itself past the largest).
  int BucketFor(int rows) const;
  cuda::StepPlan Plan(int rows, bool decode, bool profiling = false) const;

  CudaEngineOptions options_;
  ModelConfig config_;
  std::string model_id_;
  int32_t max_context_ = 0;
  KvGeometry kv_;
  int max_bucket_ = 0;
  int max_rows_ = 0;  // rows of one forward
  int logit_rows_ = 0;
  cuda::PlanModel plan_model_;
  cuda::DeviceLimits limits_;
  std::map<int, cuda::StepPlan> decode_plans_;  // by bucket

  cuda::StepStreams streams_;
  cuda::ModelWeights weights_;
  std::unique_ptr<cuda::Workspaces> buf_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  // Decode above batch 1: the FFN's second half runs on the side stream beside the first.
  std::unique_ptr<cuda::GemmRunner> side_gemm_;
  cuda::KvPool pool_;
  std::unique_ptr<KvBlockAllocator> blocks_;
  std::unique_ptr<cuda::ForwardPass> forward_;
  std::unique_ptr<cuda::DecodeGraphs> graphs_;
  std::map<std::string, size_t> memory_;
  int64_t graph_replays_ = 0;
  int64_t clamps_ = 0;
};

}  // namespace tailserve
