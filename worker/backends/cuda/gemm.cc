#include "worker/backends/cuda/gemm.h"

#include <algorithm>
#include <limits>

#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/kernels/gemv.h"

namespace tailserve::cuda {

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool tuned = false;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

absl::StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(cudaStream_t stream, void* workspace,
                                                                size_t workspace_bytes) {
  std::unique_ptr<GemmRunner> r(new GemmRunner());
  r->stream_ = stream, r->workspace_ = workspace, r->workspace_bytes_ = workspace_bytes;
  absl::StatusOr<CublasLtHandle> lt = MakeCublasLt();
  if (!lt.ok()) return lt.status();
  r->lt_ = *std::move(lt);
  return r;
}

GemmRunner::~GemmRunner() = default;

absl::Status GemmRunner::Candidates(const Plan& plan, int wanted, cublasLtMatmulHeuristicResult_t* results,
                                    int* found) {
  cublasLtMatmulPreference_t pref = nullptr;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t bytes = workspace_bytes_;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                                           sizeof(bytes));
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(lt_.get(), plan.op, plan.a, plan.b, plan.c, plan.c, pref, wanted, results, found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  TAILSERVE_CUDA_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

cublasStatus_t GemmRunner::Matmul(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const __half* x, const __half* w,
                                  float beta, float* y) {
  const float alpha = 1.0f;
  return cublasLtMatmul(lt_.get(), plan.op, &alpha, w, plan.a, x, plan.b, &beta, y, plan.c, y, plan.c, &algo,
                        workspace_, workspace_bytes_, stream_);
}

absl::StatusOr<GemmRunner::Plan*> GemmRunner::PlanFor(int rows, int k, int n, int ldw, bool accumulate) {
  auto& slot = plans_[{rows, k, n, ldw, accumulate}];
  if (slot) return slot.get();
  auto plan = std::make_unique<Plan>();
  // Column-major view: Yᵀ[n, rows] = W[n, k] (stored k-major, so op T) · Xᵀ[k, rows].
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16F, k, n, ldw));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16F, k, rows, k));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, rows, n));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (absl::Status st = Candidates(*plan, 1, &result, &found); !st.ok()) return st;
  if (found == 0) return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for ", rows, "x", k, "x", n));
  plan->algo = result.algo;
  slot = std::move(plan);
  return slot.get();
}

absl::Status GemmRunner::Tune(Plan& plan, const __half* x, const __half* w, float beta, float* y) {
  cublasLtMatmulHeuristicResult_t results[8];
  int found = 0;
  if (absl::Status st = Candidates(plan, 8, results, &found); !st.ok()) return st;
  absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  float best = std::numeric_limits<float>::infinity();
  for (int i = 0; i < found; ++i) {
    auto run = [&] { return Matmul(plan, results[i].algo, x, w, beta, y); };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that cannot run this shape
    constexpr int kReps = 5;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream_));
    for (int r = 0; r < kReps; ++r) TAILSERVE_CUDA_RETURN_IF_ERROR(run());
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), stream_));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop->get()));
    float ms = 0.0f;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
    if (ms < best) best = ms, plan.algo = results[i].algo;
  }
  plan.tuned = true;
  ++tuned_;
  return absl::OkStatus();
}

absl::Status GemmRunner::Run(const __half* x, int rows, int k, const __half* w, int n, float beta, float* y, int ldw) {
  if (ldw == 0) ldw = k;
  if (ldw < k) return absl::InvalidArgumentError(absl::StrCat("GemmRunner: ldw ", ldw, " below k ", k));
  if (rows == 0) return absl::OkStatus();
  if (rows == 1 && k % 8 == 0 && ldw == k) {
    return Gemv({.x = x, .k = k, .w = w, .n = n, .y = y, .beta = beta}, stream_);
  }
  absl::StatusOr<Plan*> plan = PlanFor(rows, k, n, ldw, beta != 0.0f);
  if (!plan.ok()) return plan.status();
  if (tuning_ && !(*plan)->tuned) {
    if (absl::Status s = Tune(**plan, x, w, beta, y); !s.ok()) return s;
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(Matmul(**plan, (*plan)->algo, x, w, beta, y));
  return absl::OkStatus();
}

}  // namespace tailserve::cuda
