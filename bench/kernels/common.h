#pragma once
// What every mode of tailserve-bench-kernels shares (bench/kernels/main.cc): the options a mode
// reads, constant-filled device buffers, weight and KV copies rotated past L2, the graph timer,
// the decode projections at a shape, cuBLASLt tuned as the engine tunes it, and one layer's
// attention inputs.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/kv_cache.h"
#include "worker/engine/kv_dtype.h"

namespace tailserve::bench {

// The H200's device-to-device copy rate (docs/cuda-decode.md section 4): the roofline every
// table's "of 4.26 TB/s" column reads against.
inline constexpr double kCopyBandwidth = 4.26e12;  // bytes/s

// The model's shape (default Llama-3.1-8B).
struct Shape {
  int hidden, ffn, heads, kv_heads, head_dim;
};

// What the command line gives a mode.
struct BenchConfig {
  Shape m = {};
  std::vector<int> rows = {};      // batch sizes
  std::vector<int> contexts = {};  // attention context lengths
  KvDtype kv = KvDtype::kFp8E4M3;
  int reps = 50;              // launches a timed graph
  bool l2_hot = false;        // one weight / KV copy instead of copies past L2
  int vocab = 128256;         // the LM head's rows
  std::vector<int> rings_kb = {};  // StreamGemm ring sizes (0: the whole shared memory)
  cudaStream_t stream = nullptr;
};

// Device memory filled with one byte value: every fp16 / fp32 / E4M3 element finite and small.
absl::StatusOr<DeviceMemory> Filled(size_t bytes, int byte);

// The device's SM count.
absl::StatusOr<int> SmCount();

// Copies of one buffer (weights, a layer's KV), handed out in turn, so that timed launches read
// DRAM as the engine's layers do, each from its own buffer; one copy would be served from the
// 50 MB L2 after the first launch.
class RotatingCopies {
 public:
  // As many copies of `bytes` as keep the reads past L2 (256 MB in all). `l2_hot`: one copy, on
  // purpose: what a kernel would take with its data already in L2 (the ceiling of a prefetch).
  static int PastL2(size_t bytes, bool l2_hot) {
    return l2_hot ? 1 : int(std::max<size_t>(1, (size_t(256) << 20) / bytes + 1));
  }
  // One allocation, copies `stride()` bytes apart (as the engine's layers are, so GemmRunner's
  // tuning can rotate over them too).
  static absl::StatusOr<RotatingCopies> Make(size_t bytes, int count, int fill = 0x3c);
  // The next copy (the first after the last).
  template <typename T = __half>
  T* Next() {
    return reinterpret_cast<T*>(static_cast<char*>(memory_.get()) + (next_++ % size_t(count_)) * stride_);
  }
  const void* first() const { return memory_.get(); }
  size_t stride() const { return stride_; }
  int count() const { return count_; }

 private:
  DeviceMemory memory_;
  size_t stride_ = 0;
  int count_ = 1;
  size_t next_ = 0;
};

// Weight copies past L2 (one copy with l2_hot).
absl::StatusOr<RotatingCopies> WeightCopies(size_t w_bytes, bool l2_hot = false);

// Mean microseconds of `launch` over `reps` launches captured into one graph (after one warm
// replay), so launch overhead is not counted. `instantiate_flags`:
// cudaGraphInstantiateFlagUseNodePriority keeps the capturing streams' priorities.
absl::StatusOr<double> TimeGraph(cudaStream_t s, int reps, const std::function<absl::Status()>& launch,
                                 unsigned long long instantiate_flags = 0);

// A decode layer's projection at the shape: W is n × k; at batch 1 the Gemv reads the fp32 residual
// (f32_in, normed in its epilogue), adds into y (residual) or applies SwiGLU (swiglu).
struct Projection {
  const char* name;
  int n, k;
  bool f32_in, residual, swiglu;
};

// q/k/v, o, gate/up and down.
std::vector<Projection> Projections(const Shape& m);

// The largest k and n of the projections (sizes of the shared X and Y buffers).
std::pair<int, int> MaxKN(const std::vector<Projection>& projections);

// The engine's cuBLASLt call above batch 1 for projection p: RunSplitK's kDecodeKSplits chunks
// into fp32 partials (rows · n floats apart), or (whole) one GEMM, as gate/up feeds SwiGLU.
absl::Status RunLikeEngine(cuda::GemmRunner& gemm, const Projection& p, int rows, const __half* x, const __half* w,
                           float* y, bool whole = false);

// A runner of its own (plans are tuned once) whose plan for p at `rows` is tuned as the engine
// tunes it: each candidate timed over the weight copies in turn, as over the layers.
absl::StatusOr<std::unique_ptr<cuda::GemmRunner>> LayerTunedRunner(cudaStream_t s, void* work, size_t work_bytes,
                                                                   const RotatingCopies& w, const Projection& p,
                                                                   int rows, const __half* x, float* y,
                                                                   bool whole = false);

// GemmRunner's pick for the projection at `rows` (its candidates timed on the first call, as the
// engine does at start), then that pick's mean µs in a graph as the engine replays it; each call
// of `weights` gives the next weight copy.
absl::StatusOr<double> TunedGemmRunnerUs(cuda::GemmRunner& gemm, const Projection& p, int rows, const __half* x,
                                         const std::function<const __half*()>& weights, float* y, int reps,
                                         cudaStream_t s);

// One layer's decode attention inputs at `rows` sequences of `context` cached tokens: q, the block
// tables, and KV (with scales) in copies past L2 unless `l2_hot`, each launch reading the next (in a
// step the attention finds its layer's KV in DRAM).
struct AttentionInputs {
  RotatingCopies k, v, ks, vs;
  DeviceMemory q, table, seq, pos, out;
  KvGeometry g;
  RowMeta meta;
  int q_stride = 0;
  double kv_bytes = 0;  // what one launch reads
  KvLayerView Layer() { return KvLayerView{k.Next<void>(), v.Next<void>(), ks.Next<float>(), vs.Next<float>()}; }
  const float* Q() const { return static_cast<const float*>(q.get()); }
  __half* Out() const { return static_cast<__half*>(out.get()); }
};

absl::StatusOr<AttentionInputs> MakeAttentionInputs(const Shape& m, KvDtype dtype, int rows, int context,
                                                    bool l2_hot);

}  // namespace tailserve::bench
