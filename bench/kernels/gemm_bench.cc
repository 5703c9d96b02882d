// The decode projections alone: the batch-1 Gemv (with its epilogue) and cuBLASLt above batch 1,
// as the engine runs them, beside cuBLASLt's own configuration space and a split-K written as
// partials. The RMSNorm and SwiGLU that cuBLASLt's path launches separately are not included.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/kernels/common.h"
#include "bench/kernels/modes.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/gemv.h"

namespace tailserve::bench {
namespace {

// The batch-1 Gemv of projection p as the engine launches it (without the preload and the
// programmatic launch, which the caller sets).
cuda::GemvArgs GemvFor(const Projection& p, const DeviceMemory& x16, const DeviceMemory& x32, const DeviceMemory& y,
                       const DeviceMemory& act, const DeviceMemory& sums) {
  cuda::GemvArgs a{.k = p.k, .n = p.n};
  if (p.f32_in) {
    a.x_f32 = static_cast<const float*>(x32.get()), a.in_sumsq = static_cast<const float*>(sums.get()), a.eps = 1e-5f;
  } else {
    a.x = static_cast<const __half*>(x16.get());
  }
  if (p.swiglu) a.swiglu_out = static_cast<__half*>(act.get());
  else a.y = static_cast<float*>(y.get());
  if (p.residual) a.beta = 1.0f, a.out_sumsq = static_cast<float*>(sums.get());
  return a;
}

// One cuBLASLt problem in GemmRunner's layout, Yᵀ[n, rows] = W[n, k]ᵀ-op · Xᵀ[k, rows]: W and X
// read `k` of every `ld` elements (ld > k: one k chunk of a strided batch), Y fp32.
struct LtProblem {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  LtProblem() = default;
  LtProblem(const LtProblem&) = delete;
  LtProblem& operator=(const LtProblem&) = delete;
  ~LtProblem() {
    for (cublasLtMatrixLayout_t layout : {a, b, c}) {
      if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
    }
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
  static absl::StatusOr<std::unique_ptr<LtProblem>> Make(int k, int n, int rows, int ld) {
    auto p = std::make_unique<LtProblem>();
    TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16F, k, n, ld));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16F, k, rows, ld));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, n, rows, n));
    return p;
  }
  // Up to `count` of the heuristic's candidates within `work_bytes` of workspace.
  std::vector<cublasLtMatmulHeuristicResult_t> Heuristic(cublasLtHandle_t lt, int count, uint64_t work_bytes) const {
    std::vector<cublasLtMatmulHeuristicResult_t> results(count);
    cublasLtMatmulPreference_t pref = nullptr;
    int found = 0;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &work_bytes,
                                           sizeof(work_bytes));
      cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, count, results.data(), &found);
      cublasLtMatmulPreferenceDestroy(pref);
    }
    results.resize(found);
    return results;
  }
};

// One cuBLASLt configuration and its stream-timed µs.
struct LtConfig {
  cublasLtMatmulAlgo_t algo;
  std::string name;
  double us = 0;
};

template <typename T>
std::vector<T> CapArray(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) return {};
  std::vector<T> v(bytes / sizeof(T));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) return {};
  return v;
}

template <typename T>
T CapValue(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t bytes = 0;
  cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &bytes);
  return v;
}

// Every configuration of the heuristic's algorithm ids (the others time out the search without
// winning): tile × stages × split-K {1,2,3,4,6,8,16} × reduction × cluster {auto,1,2x1,1x2} that
// passes AlgoCheck, at most 12000, each ranked by `quick` (µs, negative: failed).
void SearchConfigs(cublasLtHandle_t lt, const LtProblem& prob, const std::vector<int>& ids, size_t work_bytes,
                   const std::function<double(const cublasLtMatmulAlgo_t&)>& quick, std::vector<LtConfig>& timed) {
  int checked = 0;
  for (int id : ids) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_16F, CUDA_R_32F, CUDA_R_32F, id,
                               &base) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    std::vector<uint32_t> tiles = CapArray<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    std::vector<uint32_t> stages = CapArray<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (tiles.empty()) tiles = {CUBLASLT_MATMUL_TILE_UNDEFINED};
    stages.insert(stages.begin(), CUBLASLT_MATMUL_STAGES_UNDEFINED);
    const bool splitk = CapValue<int32_t>(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
    const uint32_t schemes = CapValue<uint32_t>(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
    for (uint32_t tile : tiles) {
      for (uint32_t stage : stages) {
        for (int32_t split : {1, 2, 3, 4, 6, 8, 16}) {
          if (split > 1 && !splitk) break;
          for (uint32_t scheme : {0u, 1u, 2u, 4u}) {
            if ((split == 1) != (scheme == 0) || (scheme && !(schemes & scheme))) continue;
            for (uint16_t cluster : {uint16_t(0), uint16_t(2), uint16_t(3), uint16_t(5)}) {
              cublasLtMatmulAlgo_t algo = base;
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof(stage));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme));
              if (cluster != 0 &&
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                       sizeof(cluster)) != CUBLAS_STATUS_SUCCESS) {
                continue;
              }
              cublasLtMatmulHeuristicResult_t r{};
              if (cublasLtMatmulAlgoCheck(lt, prob.op, prob.a, prob.b, prob.c, prob.c, &algo, &r) !=
                  CUBLAS_STATUS_SUCCESS) {
                continue;
              }
              if (r.workspaceSize > work_bytes || ++checked > 12000) continue;
              const double us = quick(algo);
              if (us > 0) {
                timed.push_back({algo, absl::StrCat("id ", id, " tile ", tile, " stages ", stage, " splitk ", split,
                                                    " scheme ", scheme, " cluster ", cluster),
                                 us});
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

// Each projection at each row count, weights rotating past L2 unless l2_hot.
absl::Status BenchProjections(const BenchConfig& c) {
  cudaStream_t s = c.stream;
  const std::vector<Projection> projections = Projections(c.m);
  const int max_rows = *std::max_element(c.rows.begin(), c.rows.end());
  const auto [max_k, max_n] = MaxKN(projections);
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(max_rows) * max_k * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x32, Filled(size_t(max_rows) * max_k * 4, 0x3c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory y, Filled(size_t(max_rows) * max_n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory act, Filled(size_t(max_rows) * max_n * 2, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory sums, Filled(size_t(max_rows) * 4, 0x3c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm, cuda::GemmRunner::Create(s, work.get(), 32 << 20));
  if (c.l2_hot) std::printf("weights: one copy each (--l2-hot): read from L2 after the first launch where they fit\n\n");
  std::printf("| projection | rows | n × k | kernel | µs | TB/s | of 4.26 TB/s |\n|---|---:|---|---|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, WeightCopies(size_t(p.n) * p.k * 2, c.l2_hot));
    for (int rows : c.rows) {
      const bool gemv = rows == 1;
      cuda::GemvArgs a = GemvFor(p, x16, x32, y, act, sums);
      auto launch = [&]() -> absl::Status {
        const __half* wp = w.Next();
        a.w = wp;
        if (gemv) return cuda::Gemv(a, s);
        return gemm->Run(static_cast<const __half*>(x16.get()), rows, p.k, wp, p.n, p.residual ? 1.0f : 0.0f,
                         static_cast<float*>(y.get()));
      };
      if (!gemv) {  // time cuBLASLt's candidates for this shape first, as the engine does at start
        gemm->set_tuning(true);
        TAILSERVE_RETURN_IF_ERROR(launch());
        gemm->set_tuning(false);
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      } else {  // what `ncu --profile-from-start off` sees: one launch of each batch-1 kernel
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaProfilerStart());
        TAILSERVE_RETURN_IF_ERROR(launch());
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaProfilerStop());
      }
      TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, c.reps, launch));
      const double bytes = 2.0 * p.n * p.k + (p.f32_in && gemv ? 4.0 : 2.0) * rows * p.k;  // cuBLASLt reads fp16 X
      const double tbs = bytes / (us * 1e-6) / 1e12;
      std::printf("| %s | %d | %d × %d | %s | %.1f | %.2f | %.0f%% |\n", p.name, rows, p.n, p.k,
                  gemv ? "Gemv" : "cuBLASLt", us, tbs, 100.0 * tbs * 1e12 / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

// The batch-1 Gemv of each projection at every k split, launched plain (each launch drains before
// the next starts), programmatically (the next launch's CTAs wait on the GPU, as in the engine's
// chain), and programmatically with W's first loads copied to shared memory before the wait;
// weights rotating past L2.
absl::Status BenchGemvSplits(const BenchConfig& c) {
  cudaStream_t s = c.stream;
  const std::vector<Projection> projections = Projections(c.m);
  const auto [max_k, max_n] = MaxKN(projections);
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(max_k) * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x32, Filled(size_t(max_k) * 4, 0x3c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory y, Filled(size_t(max_n) * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory act, Filled(size_t(max_n) * 2, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory sums, Filled(4, 0x3c));
  TAILSERVE_ASSIGN_OR_RETURN(const int wave, cuda::GemvWave());
  std::printf("batch-1 Gemv by k split (0: the engine's rule), %d CTAs a wave\n\n", wave);
  std::printf("| projection | n × k | k split | µs plain | µs chained | µs chained + preload | best chained of 4.26 TB/s |\n|---|---|---:|---:|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, WeightCopies(size_t(p.n) * p.k * 2));
    for (int split : {0, 1, 2, 4, 8}) {
      double us[3] = {};
      for (int mode = 0; mode < 3; ++mode) {
        cuda::GemvArgs a = GemvFor(p, x16, x32, y, act, sums);
        a.k_split = split, a.overlap_previous = mode > 0, a.preload_w = mode == 2;
        TAILSERVE_ASSIGN_OR_RETURN(us[mode], TimeGraph(s, c.reps, [&]() -> absl::Status {
                                     a.w = w.Next();
                                     return cuda::Gemv(a, s);
                                   }));
      }
      const double bytes = 2.0 * p.n * p.k + (p.f32_in ? 4.0 : 2.0) * p.k;
      std::printf("| %s | %d × %d | %d | %.1f | %.1f | %.1f | %.0f%% |\n", p.name, p.n, p.k, split, us[0], us[1],
                  us[2], 100.0 * bytes / (std::min(us[1], us[2]) * 1e-6) / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

// Experiment, not the engine's path: how far cuBLASLt's whole configuration space (algorithm ×
// tile × stages × split-K × cluster) is from the pick GemmRunner's tuning makes among the
// heuristic's 8 first candidates, on the decode projections at `rows` > 1.
absl::Status SearchGemm(const BenchConfig& c) {
  cudaStream_t s = c.stream;
  const std::vector<Projection> projections = Projections(c.m);
  const int max_rows = *std::max_element(c.rows.begin(), c.rows.end());
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 64 << 20;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(max_rows) * max_k * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory y, Filled(size_t(max_rows) * max_n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(kWork));
  TAILSERVE_ASSIGN_OR_RETURN(CublasLtHandle lt, MakeCublasLt());
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm, cuda::GemmRunner::Create(s, work.get(), kWork));
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent start, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent stop, MakeEvent());
  std::printf("\n| projection | rows | tuned (GemmRunner) µs | heuristic best of 100 µs | search best µs | of 4.26 TB/s | configs timed | best config |\n"
              "|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Projection& p : projections) {
    TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, WeightCopies(size_t(p.n) * p.k * 2));
    for (int rows : c.rows) {
      if (rows == 1) continue;
      const float beta = p.residual ? 1.0f : 0.0f, alpha = 1.0f;
      const auto* x = static_cast<const __half*>(x16.get());
      auto* yp = static_cast<float*>(y.get());
      auto wp = [&] { return w.Next<const __half>(); };
      TAILSERVE_ASSIGN_OR_RETURN(const double tuned, TunedGemmRunnerUs(*gemm, p, rows, x, wp, yp, c.reps, s));
      TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<LtProblem> prob, LtProblem::Make(p.k, p.n, rows, p.k));
      auto matmul = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(lt.get(), prob->op, &alpha, wp(), prob->a, x, prob->b, &beta, yp, prob->c, yp, prob->c,
                              &algo, work.get(), kWork, s);
      };
      // Stream-timed mean of 8 launches after 2 warm-ups: ranks configurations; the best few are re-timed in a graph.
      auto quick = [&](const cublasLtMatmulAlgo_t& algo) -> double {
        for (int i = 0; i < 2; ++i) {
          if (matmul(algo) != CUBLAS_STATUS_SUCCESS) return -1;
        }
        cudaEventRecord(start.get(), s);
        for (int i = 0; i < 8; ++i) matmul(algo);
        cudaEventRecord(stop.get(), s);
        if (cudaEventSynchronize(stop.get()) != cudaSuccess) return -1;
        float ms = 0;
        cudaEventElapsedTime(&ms, start.get(), stop.get());
        return 1e3 * ms / 8;
      };
      std::vector<LtConfig> timed;
      // (1) the heuristic's first 100.
      const std::vector<cublasLtMatmulHeuristicResult_t> heur = prob->Heuristic(lt.get(), 100, kWork);
      double heur_best = 1e30;
      for (size_t i = 0; i < heur.size(); ++i) {
        const double us = quick(heur[i].algo);
        if (us > 0) timed.push_back({heur[i].algo, absl::StrCat("heuristic #", i), us}), heur_best = std::min(heur_best, us);
      }
      // (2) every configuration of the algorithm ids the heuristic proposes.
      std::vector<int> heur_ids;
      for (const cublasLtMatmulHeuristicResult_t& r : heur) {
        int32_t id = 0;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
        if (std::find(heur_ids.begin(), heur_ids.end(), id) == heur_ids.end()) heur_ids.push_back(id);
      }
      std::string id_list;
      for (int id : heur_ids) absl::StrAppend(&id_list, id_list.empty() ? "" : ",", id);
      std::fprintf(stderr, "%s rows %d: heuristic algorithm ids %s\n", p.name, rows, id_list.c_str());
      SearchConfigs(lt.get(), *prob, heur_ids, kWork, quick, timed);
      cudaGetLastError();  // a failed configuration's launch error is not this program's
      std::sort(timed.begin(), timed.end(), [](const LtConfig& l, const LtConfig& r) { return l.us < r.us; });
      // Re-time the 6 best in a graph.
      double best = 1e30;
      std::string best_name = "-";
      for (size_t i = 0; i < std::min<size_t>(6, timed.size()); ++i) {
        absl::StatusOr<double> us = TimeGraph(s, c.reps, [&]() -> absl::Status {
          TAILSERVE_CUDA_RETURN_IF_ERROR(matmul(timed[i].algo));
          return absl::OkStatus();
        });
        if (us.ok() && *us < best) best = *us, best_name = timed[i].name;
      }
      const double tbs = (2.0 * p.n * p.k + 2.0 * rows * p.k) / (best * 1e-6) / 1e12;
      std::printf("| %s | %d | %.1f | %.1f | %.1f | %.0f%% | %zu | %s |\n", p.name, rows, tuned, heur_best, best,
                  100.0 * tbs * 1e12 / kCopyBandwidth, timed.size(), best_name.c_str());
      std::fflush(stdout);
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    }
  }
  return absl::OkStatus();
}

// k split into S chunks as one strided-batched cuBLASLt GEMM writing S fp32 partials, which the
// next kernel (the norm after o, RoPE after q/k/v) would sum: cuBLASLt's own split-K pays a
// separate reduce kernel (2.4 µs a layer at 16 rows on o). Times the GEMM alone, best of up to 32
// heuristic candidates each timed in a graph, against GemmRunner's pick (its reduce included).
absl::Status BenchBatchedSplitK(const BenchConfig& c) {
  cudaStream_t s = c.stream;
  const std::vector<Projection> projections = Projections(c.m);
  const int max_rows = *std::max_element(c.rows.begin(), c.rows.end());
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 32 << 20;
  constexpr int kMaxSplits = 8;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(max_rows) * max_k * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory y, Filled(size_t(kMaxSplits) * max_rows * max_n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(kWork));
  TAILSERVE_ASSIGN_OR_RETURN(CublasLtHandle lt, MakeCublasLt());
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm, cuda::GemmRunner::Create(s, work.get(), kWork));
  std::printf("\n| projection | rows | GemmRunner µs | GemmRunner RunSplitK 2 µs (chunks) | RunSplitK 2 tuned over the copies µs | S = 1 | S = 2 | S = 3 | S = 4 | S = 6 | S = 8 | best of 4.26 TB/s |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, WeightCopies(size_t(p.n) * p.k * 2));
    for (int rows : c.rows) {
      if (rows == 1) continue;
      const auto* x = static_cast<const __half*>(x16.get());
      auto* yp = static_cast<float*>(y.get());
      auto wp = [&] { return w.Next<const __half>(); };
      TAILSERVE_ASSIGN_OR_RETURN(const double base, TunedGemmRunnerUs(*gemm, p, rows, x, wp, yp, c.reps, s));
      // RunSplitK's two-chunk pick tuned on its first call (one weight matrix, L2-hot), timed over
      // the rotating copies.
      const int64_t stride = int64_t(p.n) * rows;
      gemm->set_tuning(true);
      absl::StatusOr<int> chunks = gemm->RunSplitK(x, rows, p.k, wp(), p.n, 2, yp, stride);
      gemm->set_tuning(false);
      TAILSERVE_RETURN_IF_ERROR(chunks.status());
      TAILSERVE_ASSIGN_OR_RETURN(const double engine_s2, TimeGraph(s, c.reps, [&]() -> absl::Status {
                                   return gemm->RunSplitK(x, rows, p.k, wp(), p.n, 2, yp, stride).status();
                                 }));
      // The engine's tuning: each candidate timed over the copies in turn.
      TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> layered,
                                 LayerTunedRunner(s, work.get(), kWork, w, p, rows, x, yp));
      TAILSERVE_ASSIGN_OR_RETURN(const double layered_s2, TimeGraph(s, c.reps, [&]() -> absl::Status {
                                   return RunLikeEngine(*layered, p, rows, x, wp(), yp);
                                 }));
      std::printf("| %s | %d | %.1f | %.1f (%d) | %.1f |", p.name, rows, base, engine_s2, *chunks, layered_s2);
      double best_all = std::min({base, engine_s2, layered_s2});
      for (int S : {1, 2, 3, 4, 6, 8}) {
        const int kc = p.k / S;
        if (p.k % S != 0 || kc % 8 != 0) {
          std::printf(" – |");
          continue;
        }
        TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<LtProblem> prob, LtProblem::Make(kc, p.n, rows, p.k));
        const int32_t count = S;
        const int64_t k_stride = kc, c_stride = int64_t(p.n) * rows;
        for (auto [layout, stride] : {std::pair{prob->a, k_stride}, {prob->b, k_stride}, {prob->c, c_stride}}) {
          TAILSERVE_CUDA_RETURN_IF_ERROR(
              cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
          TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
              layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
        }
        const std::vector<cublasLtMatmulHeuristicResult_t> results = prob->Heuristic(lt.get(), 32, kWork);
        const float alpha = 1.0f, zero = 0.0f;
        double best = 1e30;
        for (const cublasLtMatmulHeuristicResult_t& r : results) {
          auto run = [&]() -> absl::Status {
            TAILSERVE_CUDA_RETURN_IF_ERROR(cublasLtMatmul(lt.get(), prob->op, &alpha, wp(), prob->a, x, prob->b, &zero,
                                                          yp, prob->c, yp, prob->c, &r.algo, work.get(), kWork, s));
            return absl::OkStatus();
          };
          if (!run().ok()) continue;
          absl::StatusOr<double> us = TimeGraph(s, 20, run);
          if (us.ok() && *us < best) best = *us;
        }
        if (best > 1e29) {
          std::printf(" none |");
          continue;
        }
        best_all = std::min(best_all, best);
        std::printf(" %.1f |", best);
      }
      std::printf(" %.0f%% |\n", 100.0 * 2.0 * p.n * p.k / (best_all * 1e-6) / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

}  // namespace tailserve::bench
