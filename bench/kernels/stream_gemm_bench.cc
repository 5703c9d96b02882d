// StreamGemm (kernels/stream_gemm.h: a persistent CTA an SM taking (64-column tile, k chunk) items
// from a counter) against cuBLASLt as the engine runs it, on the decode projections, a layer's
// chain of four and the LM head; and q/k/v by cuBLASLt split in two launches on graph branches.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/kernels/common.h"
#include "bench/kernels/modes.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"

namespace tailserve::bench {
namespace {

// A layer's four projections back to back at `rows` rows, as one chain per timed launch: cuBLASLt
// as the engine runs it (RunSplitK for q/k/v, o and down, gate/up whole) against StreamGemm
// launched programmatically (each copies its first W while its predecessor finishes; 4 chunks,
// gate/up 2), each projection with its own counters.
absl::Status BenchStreamGemmChain(const Shape& m, int rows, int reps, cudaStream_t s) {
  const std::vector<Projection> projections = Projections(m);
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 32 << 20;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(cuda::kStreamGemmMaxRows) * max_k * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory y, Filled(size_t(8) * cuda::kStreamGemmMaxRows * max_n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(kWork));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory counters, Filled(4 * 64 + cuda::kStreamGemmWorkspaceBytes, 0));
  std::vector<RotatingCopies> weights;
  for (const Projection& p : projections) {
    TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, WeightCopies(size_t(p.n) * p.k * 2));
    weights.push_back(std::move(w));
  }
  const auto* x = static_cast<const __half*>(x16.get());
  auto* yp = static_cast<float*>(y.get());
  std::vector<std::unique_ptr<cuda::GemmRunner>> runners;
  for (size_t i = 0; i < projections.size(); ++i) {  // tuned as the engine tunes: over the copies
    const Projection& p = projections[i];
    TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> g,
                               LayerTunedRunner(s, work.get(), kWork, weights[i], p, rows, x, yp, p.swiglu));
    runners.push_back(std::move(g));
  }
  TAILSERVE_ASSIGN_OR_RETURN(const double lt, TimeGraph(s, reps, [&]() -> absl::Status {
                               for (size_t i = 0; i < projections.size(); ++i) {
                                 const Projection& p = projections[i];
                                 TAILSERVE_RETURN_IF_ERROR(
                                     RunLikeEngine(*runners[i], p, rows, x, weights[i].Next(), yp, p.swiglu));
                               }
                               return absl::OkStatus();
                             }));
  std::printf("\n| chain of q/k/v, o, gate/up, down at %d rows | µs a chain |\n|---|---:|\n| cuBLASLt | %.1f |\n", rows,
              lt);
  for (int variant : {1, 4}) {
    for (bool overlap : {false, true}) {
      TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, reps, [&]() -> absl::Status {
                                   for (size_t i = 0; i < projections.size(); ++i) {
                                     const Projection& p = projections[i];
                                     TAILSERVE_RETURN_IF_ERROR(cuda::StreamGemm(
                                         {.x = x, .rows = rows, .k = p.k, .w = weights[i].Next(), .n = p.n,
                                          .chunks = p.swiglu ? 2 : 4, .partials = yp,
                                          .partial_stride = int64_t(p.n) * rows,
                                          .workspace = static_cast<char*>(counters.get()) + 64 * i,
                                          .overlap_previous = overlap, .variant = variant},
                                         s));
                                   }
                                   return absl::OkStatus();
                                 }));
      std::printf("| StreamGemm variant %d%s | %.1f |\n", variant, overlap ? ", programmatic" : "", us);
    }
  }
  return absl::OkStatus();
}

}  // namespace

// StreamGemm against the engine's path for the same partials: GemmRunner::RunSplitK's two chunks,
// tuned over the weight copies as the engine tunes over its layers. Both over rotating copies of
// W (past L2). Each variant runs with each ring size of rings_kb (0: the whole 227 KB): a smaller
// ring leaves room on the SM for another kernel's CTA. Then the chain of four at 16 rows.
absl::Status BenchStreamGemm(const BenchConfig& c) {
  cudaStream_t s = c.stream;
  const std::vector<Projection> projections = Projections(c.m);
  const auto [max_k, max_n] = MaxKN(projections);
  constexpr size_t kWork = 32 << 20;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(cuda::kStreamGemmMaxRows) * max_k * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory y, Filled(size_t(8) * cuda::kStreamGemmMaxRows * max_n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(kWork));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory counters, Filled(cuda::kStreamGemmWorkspaceBytes, 0));
  std::printf("| projection | rows | kernel | µs: RunSplitK 2, or StreamGemm 2 chunks | 4 chunks | 8 chunks |\n"
              "|---|---:|---|---:|---:|---:|\n");
  for (const Projection& p : projections) {
    TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, WeightCopies(size_t(p.n) * p.k * 2));
    for (int rows : c.rows) {
      if (rows < 2 || rows > cuda::kStreamGemmMaxRows) continue;
      const auto* x = static_cast<const __half*>(x16.get());
      auto* yp = static_cast<float*>(y.get());
      const int64_t stride = int64_t(p.n) * rows;
      TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm,
                                 LayerTunedRunner(s, work.get(), kWork, w, p, rows, x, yp));
      TAILSERVE_ASSIGN_OR_RETURN(const double lt, TimeGraph(s, c.reps, [&]() -> absl::Status {
                                   return RunLikeEngine(*gemm, p, rows, x, w.Next(), yp);
                                 }));
      std::printf("| %s | %d | cuBLASLt | %.1f | | | |\n", p.name, rows, lt);
      for (int variant = 0; variant < 5; ++variant) {
        for (int ring_kb : c.rings_kb) {
          std::printf("| %s | %d | variant %d, ring %s |", p.name, rows, variant,
                      ring_kb > 0 ? absl::StrCat(ring_kb, " KB").c_str() : "all");
          for (int chunks : {2, 4, 8}) {
            if (p.k % (cuda::StreamGemmKStep(variant) * chunks) != 0) {
              std::printf(" – |");
              continue;
            }
            TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, c.reps, [&]() -> absl::Status {
                                         return cuda::StreamGemm(
                                             {.x = x, .rows = rows, .k = p.k, .w = w.Next(), .n = p.n,
                                              .chunks = chunks, .partials = yp, .partial_stride = stride,
                                              .workspace = counters.get(), .max_ring_bytes = ring_kb * 1024,
                                              .variant = variant},
                                             s);
                                       }));
            std::printf(" %.1f |", us);
          }
          std::printf("\n");
        }
      }
    }
  }
  return BenchStreamGemmChain(c.m, 16, c.reps, s);
}

// The LM head (vocab × hidden, one matrix, past L2 by itself) at 1-16 rows: cuBLASLt as the engine
// runs it (GemmRunner::Run, tuned on its first call) against StreamGemm over the whole k (one
// partial: the logits), per variant.
absl::Status BenchLmHead(const BenchConfig& c) {
  cudaStream_t s = c.stream;
  const Projection p{"lm_head", c.vocab, c.m.hidden, false, false, false};
  constexpr size_t kWork = 32 << 20;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(cuda::kStreamGemmMaxRows) * p.k * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory w, Filled(size_t(p.n) * p.k * 2, 0x3c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory y, Filled(size_t(cuda::kStreamGemmMaxRows) * p.n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(kWork));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory counters, Filled(cuda::kStreamGemmWorkspaceBytes, 0));
  const auto* x = static_cast<const __half*>(x16.get());
  const auto* wp = static_cast<const __half*>(w.get());
  auto* yp = static_cast<float*>(y.get());
  std::printf("| lm_head %d × %d, rows | cuBLASLt µs | StreamGemm variant 1 | variant 3 | variant 4 | best TB/s |\n"
              "|---:|---:|---:|---:|---:|---:|\n", p.n, p.k);
  for (int rows : c.rows) {
    if (rows < 1 || rows > cuda::kStreamGemmMaxRows) continue;
    TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm, cuda::GemmRunner::Create(s, work.get(), kWork));
    TAILSERVE_ASSIGN_OR_RETURN(const double lt,
                               TunedGemmRunnerUs(*gemm, p, rows, x, [&] { return wp; }, yp, c.reps, s));
    std::printf("| %d | %.1f |", rows, lt);
    double best = lt;
    for (int variant : {1, 3, 4}) {
      TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, c.reps, [&]() -> absl::Status {
                                   return cuda::StreamGemm({.x = x, .rows = rows, .k = p.k, .w = wp, .n = p.n,
                                                            .partials = yp, .workspace = counters.get(),
                                                            .variant = variant},
                                                           s);
                                 }));
      best = std::min(best, us);
      std::printf(" %.1f |", us);
    }
    std::printf(" %.2f |\n", double(p.n) * p.k * 2 / best * 1e-6);
  }
  return absl::OkStatus();
}

// Do two cuBLASLt q/k/v GEMMs on forked graph branches stream their 50 MB (8B shape) faster than
// the engine's one? The q/k/v projection at `rows` rows as the engine runs it (RunSplitK, two k
// chunks, one launch: the in-situ pick uses 96 of 132 SMs on the H200) against the same W split
// by output columns into two parts started together on two streams (the FFN halves' trick), each
// part two k chunks into its own partials. Constant data: only time. On an H100 at 16 rows the
// parts took 20.9-23.0 µs against one launch's 19.9, and the engine's two-part q/k/v lost
// 0.03-0.04 ms a step (docs/cuda-decode.md section 5).
absl::Status BenchQkvBranches(const BenchConfig& c) {
  const Shape& m = c.m;
  const int h = m.hidden, n = (m.heads + 2 * m.kv_heads) * m.head_dim;
  // Both at the default priority, as the engine's main and side streams.
  TAILSERVE_ASSIGN_OR_RETURN(CudaStream sa, MakeStream());
  TAILSERVE_ASSIGN_OR_RETURN(CudaStream sb, MakeStream());
  const int max_rows = *std::max_element(c.rows.begin(), c.rows.end());
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x16, Filled(size_t(max_rows) * h * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory parts_a, Filled(size_t(4) * max_rows * n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory parts_b, Filled(size_t(4) * max_rows * n * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work_a, DeviceAlloc(32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work_b, DeviceAlloc(32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm_a,
                             cuda::GemmRunner::Create(sa.get(), work_a.get(), 32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm_b,
                             cuda::GemmRunner::Create(sb.get(), work_b.get(), 32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, WeightCopies(size_t(n) * h * 2));
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent fork, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent join, MakeEvent());
  for (cuda::GemmRunner* g : {gemm_a.get(), gemm_b.get()}) {
    g->set_tuning_layers(w.first(), int64_t(w.stride()), w.count());
  }
  const auto* x = static_cast<const __half*>(x16.get());
  std::printf("\n| q/k/v, %d × %d | rows | µs | of 4.26 TB/s |\n|---|---:|---:|---:|\n", n, h);
  for (int rows : c.rows) {
    if (rows < 2) continue;
    const int64_t stride = int64_t(rows) * n;
    // Columns [0, first) on A's stream, the rest on B's; first = n: one launch on A's (the engine).
    // While tuning, the first copy (the runner rotates each candidate over the copies itself).
    bool tuning = true;
    auto split = [&](int first, int splits) {
      return [&, first, splits]() -> absl::Status {
        const __half* wc = tuning ? static_cast<const __half*>(w.first()) : w.Next<const __half>();
        auto* pa = static_cast<float*>(parts_a.get());
        auto* pb = static_cast<float*>(parts_b.get());
        if (first == n) return gemm_a->RunSplitK(x, rows, h, wc, n, splits, pa, stride).status();
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork.get(), sa.get()));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sb.get(), fork.get(), 0));
        TAILSERVE_RETURN_IF_ERROR(gemm_a->RunSplitK(x, rows, h, wc, first, splits, pa, stride).status());
        TAILSERVE_RETURN_IF_ERROR(
            gemm_b->RunSplitK(x, rows, h, wc + size_t(first) * h, n - first, splits, pb, stride).status());
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join.get(), sb.get()));
        TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(sa.get(), join.get(), 0));
        return absl::OkStatus();
      };
    };
    const int q = m.heads * m.head_dim;
    std::vector<std::pair<std::string, std::function<absl::Status()>>> variants = {
        {"one launch, 2 k chunks (the engine)", split(n, 2)},
        {"one launch, 4 k chunks", split(n, 4)},
        {absl::StrCat("columns ", n / 2, " + ", n / 2, " at once, 2 k chunks each"), split(n / 2, 2)},
        {absl::StrCat("columns ", q, " (q) + ", n - q, " (k, v) at once, 2 k chunks each"), split(q, 2)},
        {absl::StrCat("columns ", n / 2, " + ", n / 2, " at once, 4 k chunks each"), split(n / 2, 4)},
    };
    // cuBLASLt's timing of every shape first (over the weight copies, as the engine over its layers).
    for (cuda::GemmRunner* g : {gemm_a.get(), gemm_b.get()}) g->set_tuning(true);
    for (auto& [name, launch] : variants) TAILSERVE_RETURN_IF_ERROR(launch());
    for (cuda::GemmRunner* g : {gemm_a.get(), gemm_b.get()}) g->set_tuning(false);
    tuning = false;
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    const double bytes = 2.0 * n * h;
    for (auto& [name, launch] : variants) {
      TAILSERVE_ASSIGN_OR_RETURN(const double us,
                                 TimeGraph(sa.get(), c.reps, launch, cudaGraphInstantiateFlagUseNodePriority));
      std::printf("| %s | %d | %.1f | %.0f%% |\n", name.c_str(), rows, us,
                  100.0 * bytes / (us * 1e-6) / kCopyBandwidth);
    }
  }
  return absl::OkStatus();
}

}  // namespace tailserve::bench
