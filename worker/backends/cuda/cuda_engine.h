#pragma once
// The GPU backend: fp16 weights and activations (fp32 residual stream and accumulation), a paged
// KV cache (FP8 E4M3 by default) and one CUDA graph replay per decode step. Everything on the device is allocated once in Load(): weights, the KV block
// pool (sized from free memory), workspaces, and the graphs, captured for each batch-size bucket.
// A step runs the prefill of new tokens eagerly in chunks (all but each sequence's last token),
// then the last token of every sequence through the graph of the smallest bucket that fits;
// sampling happens on the GPU and only token ids come back.
#include <cuda_fp16.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/backends/cuda/kernels/sampling.h"
#include "worker/engine/engine.h"

namespace tailserve {

struct CudaEngineOptions {
  KvDtype kv_dtype = KvDtype::kFp8E4M3;
  double kv_memory_fraction = 0.9;  // of the device memory left after weights and workspaces
  int block_size = 16;
  std::vector<int> buckets = {1, 2, 4, 8, 16, 32, 64, 128};  // decode graphs
  int prefill_chunk = 2048;  // tokens per eager prefill forward
  int max_sequences = 256;   // sequences holding KV at once
  int max_context = 0;       // 0: the model's max_position_embeddings
  int attention_splits = 32;
  int logits_rows = 0;       // rows whose logits one forward can produce (0: the largest bucket)
  bool use_graphs = true;
  int device = 0;
  // Decode above batch 1 runs the FFN as two halves on two graph branches when its three matrices
  // hold at least this many bytes (CudaEngine::Forward says why; 0: always, as tests do).
  int64_t ffn_halves_min_bytes = int64_t{200} << 20;
  // Decode at stream_ffn_min_rows-16 rows: a dense FFN as one StreamFfn launch
  // (kernels/stream_gemm.h: gate/up, SwiGLU and down in one persistent grid) instead of cuBLASLt's
  // halves, down in this many k chunks (fewer where ffn does not divide; at most kMaxPartials),
  // taken `stream_ffn_lag` gate/up groups behind, up to `stream_ffn_k_boxes` k boxes a ring stage
  // (0 chunks: off). On from 3 rows (the 4-row bucket up), with q/k/v by StreamGemm below and the
  // norm before each triggering at once, so each streams its W during the norm (bench/CUDA_NOTES.md
  // 12-06 (51), H100 8B against the halves and cuBLASLt's q/k/v: b4 5.872 → 5.686, b8 5.912 →
  // 5.692, b16 5.956 → 5.852 ms; at b2 the 1B lost, 1.261 → 1.302).
  int stream_ffn_chunks = 4;
  int stream_ffn_min_rows = 3;
  int stream_ffn_lag = 3;
  int stream_ffn_k_boxes = 4;
  // StreamFfnArgs::last_chunk / last_chunks where ffn splits that way, else equal chunks. -1: the
  // rule, ffn · 5 / 28 rounded down to 256 features (the 8B's 14336 = 6656 + 3 · 2560, best of the
  // splits measured, 12-06 (49)); 0: equal chunks.
  int stream_ffn_last_chunk = -1;
  int stream_ffn_last_chunks = 3;
  // 2: two StreamFfn CTAs an SM, each with half a ring (StreamFfnArgs::max_ring_bytes): two
  // pipelines an SM where one stage's fixed cost caps a CTA (bench/CUDA_NOTES.md 12-06 (49)).
  int stream_ffn_ctas_per_sm = 1;
  // At the same rows, q/k/v by StreamGemm in this many k chunks, 0-kMaxPartials (0: cuBLASLt's
  // split-K). 2 measured 0.01 ms faster than 4 on the H100 (8B and 1B b16), but leaves 60 of 132
  // CTAs an item in the 8B's last wave, short of the H200's DRAM rate.
  int stream_qkv_chunks = 4;
  // Which RMSNorms let their StreamGemm / StreamFfn follower launch before the norm's wait, so its
  // W streams during the previous kernel's last CTAs too, not only during the norm: bit 0 the norm
  // before q/k/v (after StreamFfn), bit 1 the norm before the FFN (after the attention block).
  // Both: 8B b16 5.870 → 5.768 ms on an H100 (bench/RESULTS.md, 53rd session).
  int norm_trigger_first = 3;
  // After timing each cuBLASLt shape alone, time up to this many of its candidates inside the
  // captured step and keep the fastest (CudaEngine::TuneInSitu; 1: the pick timed alone). 12 took
  // longer to load and gave the 8B step nothing more than 6 (b16 4.607 / 4.620 against 4.600 /
  // 4.600).
  int in_situ_candidates = 6;
  // Decode at attention_block_min_rows-16 rows on an FP8 cache, where the shape allows (kernels/attention_block.h):
  // kWhole runs q/k/v, the attention and o as one persistent launch instead of cuBLASLt,
  // PagedAttention and cuBLASLt; kAfterQkv takes q/k/v computed before it (cuBLASLt's split-K, or
  // StreamGemm's chunks where stream_qkv_chunks applies) and runs the attention and o as one
  // launch, W_o streaming once the key tiles are asked for. kWhole measured slower on the H200
  // (8B batch 16 4.612 → 4.879 ms, its q/k/v phase streaming at ~2 TB/s; bench/CUDA_NOTES.md,
  // 12-04 (35)). kAfterQkv against kOff (bench/CUDA_NOTES.md, 12-05 (40), H100, 512 tokens): 8B
  // b4 −0.07, b8 −0.17, b16 −0.06 ms; 1B b8 −0.015, b16 −0.056; but b2 +0.013 (8B) and +0.052
  // (1B), hence from attention_block_min_rows.
  enum class AttentionBlockUse { kOff, kWhole, kAfterQkv };
  AttentionBlockUse attention_block = AttentionBlockUse::kAfterQkv;
  int attention_block_min_rows = 4;  // the smallest bucket that takes the block
  // kAfterQkv: key tiles a warp keeps in flight (AttentionBlockArgs::key_stages, 2-4); above 2 the
  // W_o ring keeps only the stages that leave room for them. The kernel bench found 4 no faster
  // while W_o streamed from the start (16 rows: 43.0-43.5 µs against 42.1-42.5 with 2).
  int attention_block_key_stages = 2;
  // kAfterQkv: once a CTA's attention is merged, W_o's ring also takes the ring stages it did not
  // start with and the key buffers (AttentionBlockArgs::late_o_stages), so 6 of a CTA's 8 W_o boxes
  // (8B shape) can be in before o starts, where 4 are now. Off: with W_o streaming from the start it
  // measured no faster (12-05 (37)); with W_o waiting for the keys the DRAM idles ~5 µs before o
  // starts at 16 rows (12-05 (40)); the kernel bench on the H200 then read 40.1-40.2 µs against
  // 40.2-40.5 at 16 rows (12-05 (41)), within noise.
  bool attention_block_late_o_stages = false;
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

  // Teacher-forced logits of one sequence (a fresh one, released afterwards): [tokens, vocab].
  absl::Status ForwardAllLogits(std::span<const int32_t> tokens, std::vector<float>* logits);
  std::optional<EngineStats> stats() const override;
  const ModelConfig& config() const { return config_; }
  const CudaEngineOptions& options() const { return options_; }
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
  struct Layer {
    const float* mlp_norm = nullptr;  // MoE only: the router's input norm (folded into the matrices elsewhere)
    const __half* w_qkv = nullptr;  // [q + 2 kv, h]
    const float* b_qkv = nullptr;          // or null
    const __half* w_o = nullptr;    // [h, q]
    const float* b_o = nullptr;
    const __half* w_gate_up = nullptr;  // [2 ffn, h] (dense) or per expert below
    const __half* w_down = nullptr;     // [h, ffn]
    const float* w_router = nullptr;   // [experts, h], fp32 (see MoeRouterLogits)
    std::vector<const __half*> expert_gate_up, expert_down;
    KvLayerView kv;
  };
  // Device buffers of one forward: step inputs (uploaded in one copy) and activations.
  struct Buffers;
  struct SeqState {
    int table_row = -1;
    std::vector<int32_t> blocks;
    int64_t cached = 0;  // positions whose K/V are in the cache
    int64_t reserved = 0;  // blocks held for it at admission (Reserve)
  };

  explicit CudaEngine(const CudaEngineOptions& options);
  absl::Status Init(const Checkpoint& ckpt);
  absl::Status LoadWeights(const Checkpoint& ckpt);
  absl::Status AllocateWorkspaces();
  absl::Status CaptureGraphs();
  // Times each cuBLASLt shape of a bucket's step with its other candidates, in the replayed graph
  // itself, and keeps the fastest (gemm.h says why).
  absl::Status TuneInSitu(int rows);
  // Median ms of `replays` replays of a freshly captured graph of the bucket.
  absl::StatusOr<float> TimeStepGraph(int rows, int replays);
  // Bytes between one layer's weight matrices and the next's when every dense layer's are that
  // far apart (they are loaded in one arena, layer by layer); else 0.
  int64_t LayerStrideBytes() const;
  struct Profile;
  // Captures a decode Forward(rows, rows, true) as a graph; with `profile`, an event after every op.
  absl::StatusOr<CudaGraphExec> CaptureForward(int rows, Profile* profile);
  // Where a decode graph's Forward leaves the sampled ids and the clamp count: the host mirrors'
  // mapped addresses, so no copy sits at the end of the step's chain.
  struct GraphIo {
    int32_t* sampled;
    unsigned long long* clamps;
  };
  // Runs the layers over `rows` token rows whose inputs are already on the device; with
  // `logit_rows` > 0 also the final norm and LM head of that many rows. `decode`: one row per
  // sequence, and the logits are sampled; otherwise prefill rows, runs of consecutive positions.
  absl::Status Forward(int rows, int logit_rows, bool decode, const GraphIo* io = nullptr);
  // Attention splits for `tiles` row tiles: enough CTAs to fill the GPU, no more.
  int SplitsFor(int tiles) const;
  absl::Status EnsureBlocks(SeqState& s, int64_t positions);
  // The sequence's state, created with a block-table row on first use (RESOURCE_EXHAUSTED when
  // every row is taken; nothing is left behind then).
  absl::StatusOr<SeqState*> StateFor(uint64_t id);
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
  // The smallest decode bucket holding `rows` rows (`rows` itself past the largest).
  int BucketFor(int rows) const;

  CudaEngineOptions options_;
  ModelConfig config_;
  std::string model_id_;
  int32_t max_context_ = 0;
  KvGeometry kv_;
  int64_t num_blocks_ = 0;
  int max_bucket_ = 0;
  int max_rows_ = 0;     // rows of one forward
  int logit_rows_ = 0;

  CudaStream stream_;
  // A decode graph's side branch (the clamp count's copy, beside the LM head): fork and join.
  CudaStream side_stream_;
  CudaEvent fork_, join_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  // Decode above batch 1: the FFN's second half runs on side_stream_ beside the first (Forward).
  std::unique_ptr<cuda::GemmRunner> side_gemm_;
  CudaEvent ffn_fork_, ffn_join_;
  DeviceMemory weight_memory_, kv_memory_, work_memory_;
  std::map<std::string, size_t> memory_;
  const __half* embed_ = nullptr;
  const __half* lm_head_ = nullptr;
  const float* inv_freq_ = nullptr;
  std::vector<Layer> layers_;
  std::unique_ptr<Buffers> buf_;
  std::map<int, CudaGraphExec> graphs_;  // by bucket

  // Host side of the KV cache: free blocks, block-table rows, per-sequence state.
  std::vector<int32_t> free_blocks_;
  int64_t reserved_blocks_ = 0;  // promised to admitted sequences, not yet taken from free_blocks_
  std::vector<int> free_table_rows_;
  int trash_row_ = 0;  // padded graph rows write here (block 0, never handed out)
  std::vector<int32_t> host_table_;  // [max_sequences + 1, max_blocks_per_seq], pinned mirror below
  std::vector<char> table_dirty_;
  std::unordered_map<uint64_t, SeqState> seqs_;
  int64_t graph_replays_ = 0;
  int sm_count_ = 132;
  int attention_wave_ = 396;  // decode attention CTAs the GPU holds at once
  // Set only inside ProfileDecode: Forward records the next event of `events` after each op.
  struct Profile {
    std::vector<CudaEvent> events;
    std::vector<const char*> names;
  };
  Profile* profile_ = nullptr;
  int64_t clamps_ = 0;
};

}  // namespace tailserve
