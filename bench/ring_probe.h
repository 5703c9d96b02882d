#pragma once
// The kernel bench's --ring-probe: what one CTA's TMA ring streams an SM, stripped of everything
// StreamFfn does beside it (no items, counters, X, MMAs or epilogues), to find what sets the
// ~0.35 µs a stage that caps StreamFfn's per-SM rate (bench/CUDA_NOTES.md 12-06 (49)).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace tailserve::bench {

struct RingProbeArgs {
  const __half* w = nullptr;  // [rows, k], streamed as 64-row × 64-k TMA boxes
  int rows = 0;               // a multiple of 64
  int k = 0;                  // a multiple of 64 · k_boxes
  int k_boxes = 1;            // boxes a stage: 1, 2 or 4
  // Warps that wait for each filled stage and release it: 4 (StreamFfn's), 1, or 0 (the producer
  // itself waits for a stage's bytes before it refills it).
  int consumers = 4;
  // The producer's stage index and phase: as StreamFfn computes them (slot % stages, slot /
  // stages) or counted (no division).
  bool divide = true;
  int ctas = 0;  // one a 64-row tile at most; each takes tiles blockIdx, + ctas, ...
};

// One launch; InvalidArgument on a shape it does not take.
absl::Status RingProbe(const RingProbeArgs& args, cudaStream_t stream);

}  // namespace tailserve::bench
