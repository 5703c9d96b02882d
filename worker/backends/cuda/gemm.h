#pragma once
// The GEMM every projection uses: Y[rows, n] (fp32) = X[rows, k] (fp16) · W[n, k]ᵀ (fp16, the HF
// nn.Linear layout) + beta · Y, fp32 accumulation. beta = 1 fuses the residual add into the
// projection that produces it. One row goes to the streaming Gemv kernel, 2..32 rows to the
// stream-K SkinnyGemm (kernels/skinny_gemm.h), more through cuBLASLt, whose algorithm for each
// shape is timed once at start (Tuning) rather than taken from the heuristic: at 16-64 rows the
// heuristic's first choice streamed the 8B shape's o/down/qkv weights at only 2.2-2.9 TB/s.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "worker/backends/cuda/cuda_resources.h"

namespace tailserve::cuda {

class GemmRunner {
 public:
  // `workspace` (device, `workspace_bytes`, at least WorkspaceBytes()) holds the SkinnyGemm's
  // partials and cuBLASLt's scratch; the caller owns it. Create zeroes the SkinnyGemm's part on
  // the stream.
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(cudaStream_t stream, void* workspace,
                                                            size_t workspace_bytes);
  static size_t WorkspaceBytes();
  ~GemmRunner();

  // `overlap_previous`: the projection may start while the kernel before it on the stream
  // finishes (programmatic launch; the SkinnyGemm and the Gemv only).
  absl::Status Run(const __half* x, int rows, int k, const __half* w, int n, float beta, float* y,
                   bool overlap_previous = false);
  // out[rows, n / 2] (fp16) = silu(gate)·up of X·Wᵀ, W's rows gate and up interleaved: in the
  // SkinnyGemm's epilogue where it takes the shape, else Run into `scratch` (fp32 [rows, n]) and the
  // SwiGLU kernel.
  absl::Status RunSwiGlu(const __half* x, int rows, int k, const __half* w, int n, float* scratch, __half* out,
                         bool overlap_previous = false);

  // While on (never during graph capture), the first Run of a shape times up to 8 of cuBLASLt's
  // candidate algorithms on that very call (same buffers; beta = 1 calls accumulate several
  // times into y) and keeps the fastest for every later Run of the shape.
  void set_tuning(bool on) { tuning_ = on; }
  int tuned_shapes() const { return tuned_; }
  // CTAs of the SkinnyGemm's stream-K split (0: one an SM; at most two an SM). For the benchmark.
  void set_skinny_ctas(int ctas) { skinny_ctas_ = ctas; }
  // Off: 2..32 rows through cuBLASLt too (the benchmark's comparison). Its default is on unless
  // the debug knob TAILSERVE_DEBUG_GEMM=cublaslt (read at Create) says otherwise, for A/B runs.
  void set_skinny(bool on) { skinny_ = on; }

 private:
  struct Plan;
  GemmRunner() = default;
  absl::StatusOr<Plan*> PlanFor(int rows, int k, int n, bool accumulate);
  // Up to `wanted` of cuBLASLt's heuristic candidates for the plan's shape.
  absl::Status Candidates(const Plan& plan, int wanted, cublasLtMatmulHeuristicResult_t* results, int* found);
  // Y = W·X + beta·Y on the stream with one algorithm (its scratch: the runner's workspace).
  cublasStatus_t Matmul(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const __half* x, const __half* w,
                        float beta, float* y);
  absl::Status Tune(Plan& plan, const __half* x, const __half* w, float beta, float* y);
  bool TakesSkinny(const __half* x, int rows, int k, const __half* w) const;

  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;  // cuBLASLt's
  size_t workspace_bytes_ = 0;
  void* skinny_workspace_ = nullptr;
  size_t skinny_workspace_bytes_ = 0;
  int skinny_ctas_ = 0;
  bool skinny_ = true;
  CublasLtHandle lt_;
  bool tuning_ = false;
  int tuned_ = 0;
  std::map<std::tuple<int, int, int, bool>, std::unique_ptr<Plan>> plans_;
};

}  // namespace tailserve::cuda
