#pragma once
// The decode projection for 2..32 rows: Y[rows, n] (fp32) = X[rows, k] (fp16) · W[n, k]ᵀ (fp16)
// + beta · Y, fp32 accumulation, streaming W once at as much of the DRAM bandwidth as it can.
//
// The shape cuBLASLt's own kernels have on Hopper, without their grid boundaries: a CTA is one
// producer warp issuing TMA tile copies (W: 128 columns × 64 k, X: all rows × 64 k, 128-byte
// swizzle) into a ring of shared-memory stages on mbarriers, and four consumer warps feeding the
// tensor cores (ldmatrix + mma.sync) from it, so the bytes in flight live in shared memory, not
// registers (bench/CUDA_NOTES.md: eight register-fed designs stopped short of cuBLASLt). Work is
// split stream-K: one CTA an SM, each taking an equal run of the (column tile, k block) pairs, so
// every projection is exactly one wave whatever its shape; a tile split between CTAs is summed by
// the last to arrive, in CTA order (deterministic), from partials in the workspace.
//
// Launched with `overlap_previous`, a CTA copies its first W stages before waiting for the
// previous kernel (W is constant) and only then its X and the residual: a projection's ramp
// overlaps its predecessor's tail.
//
// At most 32 rows: at 64, mma.sync's rate bounds the consumers (measured 1.3-1.9x slower than
// cuBLASLt, whose Hopper kernels use wgmma).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace tailserve::cuda {

inline constexpr int kSkinnyGemmMaxRows = 32;

struct SkinnyGemmArgs {
  const __half* x = nullptr;  // [rows, k], 16-byte aligned
  int rows = 0;               // 1..32
  int k = 0;                  // a multiple of 8
  const __half* w = nullptr;  // [n, k], 16-byte aligned
  int n = 0;
  // One output: y (fp32 [rows, n]) = X·Wᵀ + beta·y, or swiglu_out (fp16 [rows, n / 2]) =
  // silu(gate)·up with W's rows gate and up interleaved (2i, 2i + 1), as the engine lays them out.
  float* y = nullptr;
  float beta = 0.0f;
  __half* swiglu_out = nullptr;
  // SkinnyGemmWorkspaceBytes() bytes, zeroed once before the first launch; each launch leaves it
  // zeroed again. Launches sharing a workspace must be on one stream.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool overlap_previous = false;
  int ctas = 0;  // CTAs of the stream-K split; 0: one an SM
  // Debug timeline (the benchmark's): if set, [ctas][4] %globaltimer stamps of each CTA's start,
  // first stage arrived, last stage consumed and end.
  unsigned long long* stamps = nullptr;
  int variant = 0;  // experiment: 1 L2 promotion to 256 B, 2 no eviction hints, 4 twice the splits, 8 half
};

// Workspace for any launch (n up to 524288, up to 1024 CTAs).
size_t SkinnyGemmWorkspaceBytes();

// InvalidArgument on a shape or alignment it does not take; the TMA descriptor's or the launch's
// error otherwise.
absl::Status SkinnyGemm(const SkinnyGemmArgs& args, cudaStream_t stream);

}  // namespace tailserve::cuda
