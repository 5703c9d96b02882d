// The decode attention alone (PagedAttention over a paged cache at each split and warp count),
// and the probe of whether o's weights can stream beside it (graph branches, no dependency).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
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
#include "bench/overlap_probe.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"
#include "worker/backends/cuda/gemm.h"
#include "worker/backends/cuda/kernels/attention.h"
#include "worker/backends/cuda/plan/decode_plan.h"

namespace tailserve::bench {

// One row per sequence at position `context`, for each row count and context, at each (splits,
// warps) the kernel takes; KV rotating past L2 unless l2_hot.
absl::Status BenchAttention(const BenchConfig& c) {
  const Shape& m = c.m;
  cudaStream_t s = c.stream;
  const int hd = m.head_dim;
  TAILSERVE_ASSIGN_OR_RETURN(const int per_sm,
                             cuda::AttentionCtasPerSm({.heads = m.heads}, {16, m.kv_heads, hd, 1, c.kv}));
  std::printf("\ndecode attention, %s cache, %d CTAs per SM; one row per sequence at position `context`; KV %s\n\n",
              KvDtypeName(c.kv), per_sm, c.l2_hot ? "one copy (L2-hot where it fits)" : "rotating copies past L2");
  std::printf("| rows | context | splits | warps | µs | KV GB/s read | of 4.26 TB/s |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int rows : c.rows) {
    for (int context : c.contexts) {
      TAILSERVE_ASSIGN_OR_RETURN(AttentionInputs in, MakeAttentionInputs(m, c.kv, rows, context, c.l2_hot));
      // 4·s warps in one split stream as s splits of 4 warps (FP8 decode on the tensor cores).
      const bool wide = cuda::AttentionTakesNewKv(in.g);
      for (auto [splits, warps] : {std::pair{1, 4}, {2, 4}, {4, 4}, {8, 4}, {16, 4}, {32, 4}, {1, 8}, {1, 16}, {2, 16}}) {
        if (warps != 4 && !wide) continue;
        const cuda::AttentionShape shape{.rows = rows, .heads = m.heads, .q_stride = in.q_stride, .splits = splits,
                                         .scale = 1.0f / std::sqrt(float(hd)), .warps = warps};
        TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory ws, DeviceAlloc(cuda::AttentionWorkspaceFloats(shape, hd) * 4));
        TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, c.reps, [&] {
                                     return cuda::PagedAttention(in.Q(), shape, in.meta, in.g, in.Layer(),
                                                                 static_cast<float*>(ws.get()), in.Out(), s);
                                   }));
        const double gbs = in.kv_bytes / (us * 1e-6) / 1e9;
        std::printf("| %d | %d | %d | %d | %.1f | %.0f | %.0f%% |\n", rows, context, splits, warps, us, gbs,
                    100.0 * gbs * 1e9 / kCopyBandwidth);
      }
    }
  }
  return absl::OkStatus();
}

// The probe before a dataflow attention + o design at batch 16: can o's W (or any W) stream on the
// room an attention CTA leaves on its SM while the attention runs, without slowing it? Times the
// attention (8 or 16 warps a CTA, one split), a pure DRAM read of o's bytes (StreamRead, 1-4 CTAs
// an SM) and cuBLASLt's o (two k chunks, as the engine) alone, then in pairs on two graph branches
// with no dependency between them (the data is not what a layer computes: only time). If a pair
// takes about the longer of its two, the SMs can stream W beside the attention.
absl::Status BenchOverlap(const BenchConfig& c) {
  const Shape& m = c.m;
  cudaStream_t s = c.stream;
  const int rows = 16, context = 512, hd = m.head_dim, h = m.hidden, qd = m.heads * hd;
  TAILSERVE_ASSIGN_OR_RETURN(AttentionInputs in, MakeAttentionInputs(m, c.kv, rows, context, false));
  TAILSERVE_ASSIGN_OR_RETURN(const int sms, SmCount());
  const size_t o_bytes = size_t(h) * qd * 2;
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, RotatingCopies::Make(o_bytes, RotatingCopies::PastL2(o_bytes, false)));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x, Filled(size_t(rows) * qd * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory partials, Filled(size_t(cuda::kDecodeKSplits) * rows * h * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory sink, Filled(64, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory work, DeviceAlloc(32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory ws, DeviceAlloc(size_t(64) << 20));
  TAILSERVE_ASSIGN_OR_RETURN(CudaStream side, MakeStream());
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cuda::GemmRunner> gemm,
                             cuda::GemmRunner::Create(side.get(), work.get(), 32 << 20));
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent fork, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent join, MakeEvent());
  using Launch = std::function<absl::Status(cudaStream_t)>;
  auto attention = [&](int warps) -> Launch {
    return [&, warps](cudaStream_t st) {
      const cuda::AttentionShape shape{.rows = rows, .heads = m.heads, .q_stride = in.q_stride, .splits = 1,
                                       .scale = 1.0f / std::sqrt(float(hd)), .warps = warps};
      return cuda::PagedAttention(in.Q(), shape, in.meta, in.g, in.Layer(), static_cast<float*>(ws.get()), in.Out(),
                                  st);
    };
  };
  // The runner is bound to the side stream: o always runs on the side branch.
  const Launch o_gemm = [&](cudaStream_t) -> absl::Status {
    return gemm
        ->RunSplitK(static_cast<const __half*>(x.get()), rows, qd, w.Next(), h, cuda::kDecodeKSplits,
                    static_cast<float*>(partials.get()), int64_t{rows} * h)
        .status();
  };
  auto read = [&](int per_sm) -> Launch {
    return [&, per_sm](cudaStream_t st) {
      return bench::StreamRead(w.Next(), o_bytes, per_sm * sms, static_cast<unsigned*>(sink.get()), st);
    };
  };
  const Launch nothing = [](cudaStream_t) { return absl::OkStatus(); };
  // a on the main stream and b on a side branch, joined: at once (b captured first when b_first)
  // or b after a (serial).
  auto pair = [&](Launch a, Launch b, bool b_first, bool serial) -> std::function<absl::Status()> {
    return [&, a, b, b_first, serial]() -> absl::Status {
      if (serial) TAILSERVE_RETURN_IF_ERROR(a(s));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork.get(), s));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side.get(), fork.get(), 0));
      if (b_first || serial) TAILSERVE_RETURN_IF_ERROR(b(side.get()));
      if (!serial) TAILSERVE_RETURN_IF_ERROR(a(s));
      if (!b_first && !serial) TAILSERVE_RETURN_IF_ERROR(b(side.get()));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join.get(), side.get()));
      TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, join.get(), 0));
      return absl::OkStatus();
    };
  };
  gemm->set_tuning(true);
  TAILSERVE_RETURN_IF_ERROR(o_gemm(side.get()));
  gemm->set_tuning(false);
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::printf("\noverlap probe: 16 rows, 512 tokens, %s; o's W %.1f MB (%.1f µs at 4.26 TB/s), KV %.1f MB\n\n",
              KvDtypeName(c.kv), o_bytes / 1e6, o_bytes / kCopyBandwidth * 1e6, in.kv_bytes / 1e6);
  std::printf("| what | µs |\n|---|---:|\n");
  std::vector<std::pair<std::string, std::function<absl::Status()>>> cases;
  for (int warps : {8, 16}) {
    cases.emplace_back(absl::StrCat("attention, ", warps, " warps a CTA, alone"),
                       pair(attention(warps), nothing, false, true));
  }
  for (int per_sm : {1, 2, 4}) {
    cases.emplace_back(absl::StrCat("read o's bytes alone, ", per_sm, " CTAs an SM"),
                       pair(read(per_sm), nothing, false, true));
  }
  cases.emplace_back("cuBLASLt o alone (2 k chunks)", pair(nothing, o_gemm, false, true));
  for (int warps : {8, 16}) {
    cases.emplace_back(absl::StrCat("attention ", warps, " warps, then cuBLASLt o (the engine's chain)"),
                       pair(attention(warps), o_gemm, false, true));
    for (bool b_first : {false, true}) {
      for (int per_sm : {1, 2, 4}) {
        cases.emplace_back(absl::StrCat("attention ", warps, " warps beside the read, ", per_sm, " CTAs an SM",
                                        b_first ? " (read captured first)" : ""),
                           pair(attention(warps), read(per_sm), b_first, false));
      }
      cases.emplace_back(
          absl::StrCat("attention ", warps, " warps beside cuBLASLt o", b_first ? " (o captured first)" : ""),
          pair(attention(warps), o_gemm, b_first, false));
    }
  }
  for (auto& [name, launch] : cases) {
    TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, c.reps, launch));
    std::printf("| %s | %.1f |\n", name.c_str(), us);
  }
  return absl::OkStatus();
}

}  // namespace tailserve::bench
