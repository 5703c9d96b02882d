#pragma once
// The decode projection for 1-16 rows, as split-K partials: for each of `chunks` equal k ranges
// K_c, partials + c · partial_stride receives fp32 [rows, n] = X[:, K_c] · W[:, K_c]ᵀ (X fp16
// [rows, k], W fp16 [n, k], the HF nn.Linear layout). The consumer that reads the projection
// anyway adds the chunks (RoPE, the next RMSNorm: kernels/partials.h), as it does for
// GemmRunner::RunSplitK. The engine's q/k/v at 3-16 rows (DecodeTuning::stream_qkv_chunks),
// launched programmatically after the norm so that its W streams during the norm: once the
// producer's per-stage issue was trimmed it beat cuBLASLt there; before, it tied or lost, as it
// still does for o and the LM head (docs/cuda-decode.md).
// `tailserve-bench-kernels --stream-gemm / --lm-head / --mlp-branches` measure it and StreamFfn.
//
// One persistent CTA an SM: a producer warp issuing TMA copies (W: 64 or 128 columns × 64 k, X:
// 16 rows × 64 k, 128-byte swizzle; 1, 2 or 4 such boxes a stage) into a ring of shared-memory stages on mbarriers, four consumer warps
// on the tensor cores (ldmatrix + mma.sync). Work items are (64-column tile, k chunk) pairs taken
// from a counter in the workspace as a CTA's producer gets to them: an item writes its own
// partial, so no CTA waits on another's (design G, docs/cuda-decode.md, lost its short
// projections to static stream-K spans and the split tiles' fixup), and an SM that streams slower
// simply takes fewer items. The producer runs on into the next item while the consumers finish
// one, so the ring does not drain between items.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/backends/cuda/plan/stream_layout.h"

namespace tailserve::cuda {

inline constexpr size_t kStreamGemmWorkspaceBytes = 256;

struct StreamGemmArgs {
  const __half* x = nullptr;  // [rows, k], 16-byte aligned
  int rows = 0;               // 1..16
  int k = 0;                  // a multiple of 64 · chunks · the variant's k boxes a stage
  const __half* w = nullptr;  // [n, k], 16-byte aligned
  int n = 0;
  int chunks = 1;             // 1..8
  float* partials = nullptr;  // chunk c at partials + c · partial_stride, each [rows, n]
  int64_t partial_stride = 0;
  // kStreamGemmWorkspaceBytes, zeroed once before the first launch; every launch leaves it zeroed.
  // Launches sharing one must be ordered (one stream), and a launch overlapping its predecessor
  // (overlap_previous) must not share the predecessor's: it takes its first items before its wait.
  void* workspace = nullptr;
  int ctas = 0;  // 0: one an SM
  bool overlap_previous = false;
  // Shared memory for the ring of stages (at least two stages); 0: as many stages as fit in 227 KB.
  // A smaller ring leaves room on each SM for a CTA of another kernel (the kernel bench measures
  // what it costs the stream).
  int max_ring_bytes = 0;
  // The item and stage shape, swept by the kernel bench (bench/RESULTS.md): 0 64 columns an item,
  // one 64-wide k box a stage; 1 two k boxes (the fastest at 16 rows); 2 128 columns; 3 both; 4 four k boxes.
  int variant = 0;
};

// InvalidArgument on a shape or alignment it does not take; the TMA descriptor's or the launch's
// error otherwise. The first call on a device sets the variant's function attributes (allowed
// inside a thread-local stream capture, as the kernel bench does).
absl::Status StreamGemm(const StreamGemmArgs& args, cudaStream_t stream);

// A dense FFN block for 1-16 rows in one persistent launch of the same kernel: act = SwiGLU of
// x · W_gate_upᵀ, then `chunks` partials of act · W_downᵀ over equal k ranges of act (the next
// RMSNorm adds them). Gate/up items (64 interleaved columns: 32 features, the whole k) apply
// SwiGLU in their epilogue and count themselves done per feature group (= down's k chunk); a down
// item of chunk g streams its W and waits for group g's count before its TMA reads act. Items run
// in one order from one counter (at lag 2: gate/up of groups 0, 1, 2, then down 0, gate/up 3,
// down 1, ...), so a down item's features were taken `lag` groups earlier, and no boundary, SwiGLU
// kernel or ramp sits between gate/up and down. The engine's FFN at 3-16 rows
// (DecodeTuning::stream_ffn_chunks; docs/cuda-decode.md).
// No deadlock whatever the CTAs resident at once (one CTA, or fewer SMs than CTAs): an item is
// only ever held by a running CTA, which copies all of an item's stages before it takes the next,
// and a down item waits only on gate/up items taken before it.
struct StreamFfnArgs {
  const __half* x = nullptr;  // [rows, hidden], the normed residual
  int rows = 0;               // 1..16
  int hidden = 0;             // a multiple of 64
  const __half* w_gate_up = nullptr;  // [2 ffn, hidden], gate and up rows interleaved
  int ffn = 0;                        // a multiple of 64 · chunks
  const __half* w_down = nullptr;     // [hidden, ffn]
  __half* act = nullptr;              // [rows, ffn] scratch
  int chunks = 1;                     // 1..kStreamFfnMaxChunks
  int lag = 2;                        // down chunk g is taken after gate/up group g + lag (StreamFfnOrder)
  float* partials = nullptr;          // chunk g at partials + g · partial_stride, each [rows, hidden]
  int64_t partial_stride = 0;
  void* workspace = nullptr;  // as StreamGemmArgs::workspace
  int ctas = 0;               // 0: one an SM
  bool overlap_previous = false;
  // The most 64-wide k boxes a ring stage holds (1, 2 or 4; the largest that divides hidden and
  // every chunk's features is taken). A stage costs a fixed time beside its bytes: at 2 boxes an
  // item streams at ~26 GB/s an SM on the H100 and the H200 alike, short of the H200's ~34; on half
  // an H100's SMs (room in the DRAM for each) 1 / 2 / 4 boxes stream at 17 / 27 / 42 GB/s an SM
  // (docs/cuda-decode.md).
  int k_boxes = 2;
  // Features of each of the last `last_chunks` chunks (0: ffn / chunks, as the others'); the other
  // chunks share the rest equally. Smaller last chunks shorten the launch's tail: the CTAs end
  // about one item apart, and the items taken last are the last chunks' down items (hidden / 64 a
  // chunk, so with 132 SMs the last two chunks' make the final wave).
  int last_chunk = 0;
  int last_chunks = 1;
  // The kernel bench's timeline (null: none): for item i, timeline[4i ..] = {taken, ns spent waiting
  // for act (down items), done, SM}, times in %globaltimer ns; for CTA b, timeline[4 · items + 6b ..]
  // = {start, end (ns), start, end (SM cycles), cycles consumer warp 0 waited for a filled stage,
  // cycles the producer waited for a free one}.
  uint64_t* timeline = nullptr;
};

absl::Status StreamFfn(const StreamFfnArgs& args, cudaStream_t stream);

// Its item order and feature groups: plan/stream_layout.h.

}  // namespace tailserve::cuda
