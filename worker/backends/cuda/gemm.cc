#include "worker/backends/cuda/gemm.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/cuda_resources.h"
#include "worker/backends/cuda/kernels/gemv.h"

namespace tailserve::cuda {

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool tuned = false;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // PrepareCandidates'
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

absl::StatusOr<GemmRunner::Plan*> GemmRunner::PlanFor(int rows, int k, int n, int ldw, bool accumulate, int splits,
                                                      int64_t partial_stride) {
  auto& slot = plans_[{rows, k, n, ldw, accumulate, splits, partial_stride}];
  if (slot) return slot.get();
  auto plan = std::make_unique<Plan>();
  // Column-major view: Yᵀ[n, rows] = W[n, k] (stored k-major, so op T) · Xᵀ[k, rows].
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16F, k, n, ldw));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16F, k, rows, k * splits));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, rows, n));
  if (splits > 1) {  // chunk s of W and X starts s · k elements into their rows; its output s · stride
    const int32_t count = splits;
    const int64_t chunk = k;
    for (auto [layout, stride] : {std::pair{plan->a, chunk}, {plan->b, chunk}, {plan->c, partial_stride}}) {
      TAILSERVE_CUDA_RETURN_IF_ERROR(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      TAILSERVE_CUDA_RETURN_IF_ERROR(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  TAILSERVE_RETURN_IF_ERROR(Candidates(*plan, 1, &result, &found));
  if (found == 0) return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for ", rows, "x", k, "x", n));
  plan->algo = result.algo;
  slot = std::move(plan);
  return slot.get();
}

absl::Status GemmRunner::Tune(Plan& plan, const __half* x, const __half* w, float beta, float* y) {
  cublasLtMatmulHeuristicResult_t results[16];
  int found = 0;
  TAILSERVE_RETURN_IF_ERROR(Candidates(plan, 16, results, &found));
  absl::StatusOr<CudaEvent> start = MakeEvent(), stop = MakeEvent();
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  // W's counterpart in layer r (W itself when W is not a layer's).
  const auto at = reinterpret_cast<uintptr_t>(w), first = reinterpret_cast<uintptr_t>(first_layer_);
  const bool in_layers = layers_ > 1 && at >= first && at - first < static_cast<uintptr_t>(layer_bytes_);
  auto layer_w = [&](int r) {
    return in_layers ? reinterpret_cast<const __half*>(at + static_cast<uintptr_t>(r % layers_) * layer_bytes_) : w;
  };
  const int reps = std::max(5, in_layers ? layers_ : 1);
  float best = std::numeric_limits<float>::infinity();
  for (int i = 0; i < found; ++i) {
    auto run = [&](int r) { return Matmul(plan, results[i].algo, x, layer_w(r), beta, y); };
    if (run(0) != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that cannot run this shape
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream_));
    for (int r = 1; r <= reps; ++r) TAILSERVE_CUDA_RETURN_IF_ERROR(run(r));
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

std::vector<GemmRunner::Plan*> GemmRunner::PlannedShapes(int rows) const {
  std::vector<Plan*> out;
  for (const auto& [key, plan] : plans_) {
    if (std::get<0>(key) == rows) out.push_back(plan.get());
  }
  return out;
}

absl::StatusOr<int> GemmRunner::PrepareCandidates(Plan* shape, int wanted) {
  Plan& plan = *shape;
  std::vector<cublasLtMatmulHeuristicResult_t> results(std::max(wanted, 1));
  int found = 0;
  TAILSERVE_RETURN_IF_ERROR(Candidates(plan, static_cast<int>(results.size()), results.data(), &found));
  plan.candidates = {plan.algo};
  for (int i = 0; i < found && static_cast<int>(plan.candidates.size()) < wanted; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && std::memcmp(&results[i].algo, &plan.algo, sizeof(plan.algo)) != 0) {
      plan.candidates.push_back(results[i].algo);
    }
  }
  return static_cast<int>(plan.candidates.size());
}

absl::Status GemmRunner::UseCandidate(Plan* shape, int i) {
  if (i < 0 || i >= static_cast<int>(shape->candidates.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmRunner: candidate ", i, " of ", shape->candidates.size(), " prepared"));
  }
  shape->algo = shape->candidates[i];
  shape->tuned = true;
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
  return TuneAndRun(**plan, x, w, beta, y);
}

absl::Status GemmRunner::TuneAndRun(Plan& plan, const __half* x, const __half* w, float beta, float* y) {
  if (tuning_ && !plan.tuned) {
    TAILSERVE_RETURN_IF_ERROR(Tune(plan, x, w, beta, y));
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(Matmul(plan, plan.algo, x, w, beta, y));
  return absl::OkStatus();
}

absl::StatusOr<int> GemmRunner::RunSplitK(const __half* x, int rows, int k, const __half* w, int n, int splits,
                                          float* partials, int64_t partial_stride, int ldw) {
  if (ldw == 0) ldw = k;
  if (ldw < k) return absl::InvalidArgumentError(absl::StrCat("GemmRunner: ldw ", ldw, " below k ", k));
  if (splits < 1 || partial_stride < static_cast<int64_t>(rows) * n) {
    return absl::InvalidArgumentError(absl::StrCat("GemmRunner: ", splits, " splits of ", rows, "x", n,
                                                   " outputs with stride ", partial_stride));
  }
  if (k % splits != 0 || (k / splits) % 8 != 0) splits = 1;
  if (splits == 1) {
    TAILSERVE_RETURN_IF_ERROR(Run(x, rows, k, w, n, 0.0f, partials, ldw));
    return 1;
  }
  if (rows == 0) return splits;
  absl::StatusOr<Plan*> plan = PlanFor(rows, k / splits, n, ldw, false, splits, partial_stride);
  if (!plan.ok()) return plan.status();
  TAILSERVE_RETURN_IF_ERROR(TuneAndRun(**plan, x, w, 0.0f, partials));
  return splits;
}

}  // namespace tailserve::cuda
