// The card's ceilings: what its memory does for a pure stream (a copy, then a read of each decode
// op's bytes), and what one CTA's TMA ring streams an SM (bench/ring_probe.h). A card other than
// the H200 is read against its own ceilings (bench/target_carry.py, docs/cuda-decode.md section 4).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <utility>
#include <vector>

#include "bench/kernels/common.h"
#include "bench/kernels/modes.h"
#include "bench/overlap_probe.h"
#include "bench/ring_probe.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"

namespace tailserve::bench {

// A device-to-device copy (bytes read + written, the measure the H200's 4.26 TB/s is), then a
// read-only stream (StreamRead, the best of 1-8 CTAs an SM) of each decode op's bytes at the
// shape, from DRAM (copies rotate past L2). The read of an op's bytes is the least that op can
// take here, ramp and tail included.
absl::Status BenchCeilings(const BenchConfig& c) {
  const Shape& m = c.m;
  cudaStream_t s = c.stream;
  TAILSERVE_ASSIGN_OR_RETURN(const int sms, SmCount());
  const size_t copy_bytes = size_t(1) << 30;
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory src, Filled(copy_bytes, 0x3c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory dst, Filled(copy_bytes, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory sink, Filled(64, 0));
  // Timed on the stream, not in a graph: captured, the same copy read 2.77 TB/s on the H200
  // against its 4.26 (docs/cuda-decode.md section 4).
  const int copy_reps = std::max(2, c.reps / 10);
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent start, MakeEvent());
  TAILSERVE_ASSIGN_OR_RETURN(CudaEvent stop, MakeEvent());
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), s));
  for (int i = 0; i < copy_reps; ++i) {
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
  }
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), s));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
  float ms = 0.0f;
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  const double copy_us = 1e3 * ms / copy_reps, copy_tbs = 2.0 * copy_bytes / (copy_us * 1e-6) / 1e12;
  std::printf("\nceilings: %d SMs; device-to-device copy of 1 GiB on the stream: %.1f µs, %.2f TB/s read + written "
              "(the H200's: 4.26)\n\n", sms, copy_us, copy_tbs);
  const size_t h = m.hidden, qkv = size_t(m.heads + 2 * m.kv_heads) * m.head_dim, qd = size_t(m.heads) * m.head_dim;
  const std::vector<std::pair<const char*, size_t>> ops = {
      {"o", h * qd * 2},           {"q/k/v", qkv * h * 2},          {"down", h * m.ffn * 2},
      {"gate/up", 2 * h * m.ffn * 2}, {"FFN (gate/up + down)", 3 * h * m.ffn * 2}, {"LM head", size_t(c.vocab) * h * 2}};
  std::printf("| bytes of | MB | read µs | read TB/s | CTAs an SM | µs at this GPU's copy rate | µs at 4.26 TB/s |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [name, bytes] : ops) {
    TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, RotatingCopies::Make(bytes, RotatingCopies::PastL2(bytes, false)));
    double best = 0.0;
    int best_per_sm = 0;
    for (int per_sm : {1, 2, 4, 8}) {
      TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, c.reps, [&]() {
                                   return StreamRead(w.Next(), bytes, per_sm * sms, static_cast<unsigned*>(sink.get()),
                                                     s);
                                 }));
      if (best_per_sm == 0 || us < best) best = us, best_per_sm = per_sm;
    }
    std::printf("| %s | %.1f | %.1f | %.2f | %d | %.1f | %.1f |\n", name, bytes / 1e6, best, bytes / (best * 1e-6) / 1e12,
                best_per_sm, bytes / (copy_tbs * 1e12) * 1e6, bytes / kCopyBandwidth * 1e6);
  }
  return absl::OkStatus();
}

// What one CTA's TMA ring streams an SM, from a bare ring (W boxes, 4 consumer warps that only
// wait and release) up to StreamFfn's gate/up item one piece at a time: X's boxes, tiles claimed
// from a counter, the per-tile epilogue, the MMAs. The gate/up matrix's 64-row tiles over the
// whole k, at 1 / 2 / 4 boxes a stage, on an eighth of the SMs (where the DRAM leaves each SM far
// more than it takes: the SM's own cap; an H100's bare ring: 88 / 129 / 158 GB/s an SM,
// StreamFfn's gate/up items 17 / 28 / 41) and on half.
absl::Status BenchRingProbe(const BenchConfig& c) {
  cudaStream_t s = c.stream;
  TAILSERVE_ASSIGN_OR_RETURN(const int sms, SmCount());
  const int rows = 2 * c.m.ffn, k = c.m.hidden;
  const size_t bytes = size_t(rows) * k * 2;
  TAILSERVE_ASSIGN_OR_RETURN(RotatingCopies w, RotatingCopies::Make(bytes, RotatingCopies::PastL2(bytes, false)));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory x, Filled(size_t(16) * k * 2, 0x2c));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory out, Filled(size_t(16) * rows * 4, 0));
  TAILSERVE_ASSIGN_OR_RETURN(DeviceMemory counters, Filled(64, 0));
  static constexpr const char* kLevels[kRingLevels] = {"bare ring", "+ X boxes", "+ claimed tiles", "+ epilogue",
                                                       "+ MMAs (StreamFfn's item)"};
  std::printf("\nring probe: a [%d, %d] fp16 matrix (%.0f MB) in 64-row × 64-k TMA boxes\n\n"
              "| k boxes a stage | level | CTAs | µs | TB/s | GB/s an SM |\n|---:|---|---:|---:|---:|---:|\n",
              rows, k, bytes / 1e6);
  for (int k_boxes : {1, 2, 4}) {
    for (int level = 0; level < kRingLevels; ++level) {
      for (int ctas : {sms / 8, sms / 2}) {
        TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(s, c.reps, [&]() {
                                     return RingProbe({.w = w.Next<const __half>(), .rows = rows, .k = k,
                                                       .k_boxes = k_boxes, .level = static_cast<RingLevel>(level),
                                                       .x = static_cast<const __half*>(x.get()),
                                                       .out = static_cast<float*>(out.get()),
                                                       .counters = static_cast<int*>(counters.get()), .ctas = ctas},
                                                      s);
                                   }));
        const double tbs = bytes / (us * 1e-6) / 1e12;
        std::printf("| %d | %s | %d | %.1f | %.2f | %.0f |\n", k_boxes, kLevels[level], ctas, us, tbs, tbs * 1e3 / ctas);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tailserve::bench
