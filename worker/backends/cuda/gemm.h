#pragma once
// The GEMM every projection uses: Y[rows, n] (fp32) = X[rows, k] (fp16) · W[n, k]ᵀ (fp16, the HF
// nn.Linear layout) + beta · Y, fp32 accumulation. beta = 1 fuses the residual add into the
// projection that produces it. One row goes to the streaming Gemv kernel; more go through
// cuBLASLt, whose algorithm for each shape is timed once at start (Tuning) rather than taken
// from the heuristic: at 16-64 rows the heuristic's first choice streamed the 8B shape's
// o/down/qkv weights at only 2.2-2.9 TB/s.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_resources.h"

namespace tailserve::cuda {

class GemmRunner {
 public:
  // `workspace` (device, `workspace_bytes`) is cuBLASLt's scratch; the caller owns it.
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(cudaStream_t stream, void* workspace,
                                                            size_t workspace_bytes);
  ~GemmRunner();

  // ldw: elements between W's rows (0: k), so that W may be a column slice of a wider matrix, as
  // one half of the down projection's inputs is (then even one row goes through cuBLASLt: the
  // Gemv reads whole rows).
  absl::Status Run(const __half* x, int rows, int k, const __half* w, int n, float beta, float* y, int ldw = 0);

  // The k range split into `splits` equal chunks (1 where k / splits is not whole 16-byte
  // vectors), one strided-batched GEMM writing each chunk's product, fp32 [rows, n], to
  // partials + s · partial_stride: a consumer that reads Y anyway sums them (kernels/partials.h).
  // cuBLASLt's own split-K adds a reduce kernel after the GEMM; at 16-64 rows two chunks also
  // stream W faster than any configuration of the whole (docs/cuda-decode.md). Returns the chunks
  // written.
  absl::StatusOr<int> RunSplitK(const __half* x, int rows, int k, const __half* w, int n, int splits, float* partials,
                                int64_t partial_stride, int ldw = 0);

  // While on (never during graph capture), the first Run of a shape times up to 16 of cuBLASLt's
  // candidate algorithms on that very call (same buffers; beta = 1 calls accumulate several
  // times into y) and keeps the fastest for every later Run of the shape.
  void set_tuning(bool on) { tuning_ = on; }
  // The step reads every layer's W from DRAM, while timing one W again and again reads it from L2
  // (the pick tuned that way lost up to 0.7 µs to the best one timed cold, bench --ksplit). With
  // the layers' weights `layer_bytes` apart (`layers` of them from `first_layer`), a W inside the
  // first layer is timed over its counterparts in every layer in turn.
  void set_tuning_layers(const void* first_layer, int64_t layer_bytes, int layers) {
    first_layer_ = static_cast<const char*>(first_layer), layer_bytes_ = layer_bytes, layers_ = layers;
  }
  int tuned_shapes() const { return tuned_; }

  // One planned shape (defined in gemm.cc; a handle outside it, valid for the runner's life).
  struct Plan;
  // In-situ tuning (CudaEngine::TuneInSitu): a shape's algorithm timed alone is not always the
  // best inside the step, where its kernels' footprint decides what runs beside them (the FFN
  // halves share the SMs). So the caller may time a planned shape's candidates in its own launch
  // sequence: PlannedShapes lists the shapes of `rows` rows planned so far; PrepareCandidates
  // collects up to `wanted` candidates, the shape's current algorithm first, and returns their
  // count; UseCandidate makes later Runs use one (InvalidArgument past that count).
  std::vector<Plan*> PlannedShapes(int rows) const;
  absl::StatusOr<int> PrepareCandidates(Plan* shape, int wanted);
  absl::Status UseCandidate(Plan* shape, int i);

 private:
  GemmRunner() = default;
  // splits > 1: a strided batch over k chunks of k / splits (`k` is the chunk), outputs
  // partial_stride apart.
  absl::StatusOr<Plan*> PlanFor(int rows, int k, int n, int ldw, bool accumulate, int splits = 1,
                                int64_t partial_stride = 0);
  // Up to `wanted` of cuBLASLt's heuristic candidates for the plan's shape.
  absl::Status Candidates(const Plan& plan, int wanted, cublasLtMatmulHeuristicResult_t* results, int* found);
  // Y = W·X + beta·Y on the stream with one algorithm (its scratch: the runner's workspace).
  cublasStatus_t Matmul(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const __half* x, const __half* w,
                        float beta, float* y);
  absl::Status Tune(Plan& plan, const __half* x, const __half* w, float beta, float* y);
  // The plan's algorithm (tuned first while tuning is on and it is not yet).
  absl::Status TuneAndRun(Plan& plan, const __half* x, const __half* w, float beta, float* y);

  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  CublasLtHandle lt_;
  bool tuning_ = false;
  int tuned_ = 0;
  const char* first_layer_ = nullptr;
  int64_t layer_bytes_ = 0;
  int layers_ = 1;
  using Key = std::tuple<int, int, int, int, bool, int, int64_t>;  // PlanFor's arguments
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace tailserve::cuda
