#pragma once
// The kernel bench's --ring-probe: what one CTA's TMA ring streams an SM, from a bare ring up to
// StreamFfn's gate/up items one piece at a time, to find what sets the fixed cost a stage that
// caps StreamFfn's per-SM rate (docs/cuda-decode.md).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace tailserve::bench {

// What the probe does beside the ring, each level adding to the one before:
enum class RingLevel : int {
  kBare = 0,     // W boxes only, 160 KB of stages, 4 consumer warps that wait and release
  kX = 1,        // + X's 16-row box beside each W box, StreamFfn's stage layout and count
  kClaim = 2,    // + tiles claimed from a global counter, published to the consumers a stage
  kEpilogue = 3, // + StreamFfn's per-tile epilogue: stores, proxy fence, named barrier, counted
  kMma = 4,      // + the MMAs (ldmatrix of W and X, m16n8k16): StreamFfn's gate/up item
};
constexpr int kRingLevels = 5;

struct RingProbeArgs {
  const __half* w = nullptr;  // [rows, k], streamed as 64-row × 64-k TMA boxes
  int rows = 0;               // a multiple of 64
  int k = 0;                  // a multiple of 64 · k_boxes
  int k_boxes = 1;            // boxes a stage: 1, 2 or 4
  RingLevel level = RingLevel::kBare;
  const __half* x = nullptr;  // [16, k]: X (kX and up)
  float* out = nullptr;       // [16, rows]: the tiles' sums (kEpilogue and up)
  int* counters = nullptr;    // 3 ints, zero before the first launch; each launch leaves them zero
  int ctas = 0;               // one a 64-row tile at most
};

// One launch; InvalidArgument on a shape it does not take.
absl::Status RingProbe(const RingProbeArgs& args, cudaStream_t stream);

}  // namespace tailserve::bench
