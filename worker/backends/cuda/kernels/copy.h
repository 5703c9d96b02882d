#pragma once
// A copy done by a kernel instead of the copy engine: for the decode graph's inputs and clamp
// count, which live in mapped pinned host memory. Inside a graph a kernel copy costs about a
// launch; the copy-engine nodes it replaces added ~10 µs each to a step's replay
// (docs/cuda-decode.md). The kernel lets a programmatically launched follower start at once.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace tailserve::cuda {

// dst[0, bytes) = src[0, bytes). Either side may be device memory or the device address of mapped
// host memory; both 16-byte aligned (InvalidArgument otherwise), any length.
absl::Status CopyBytes(const void* src, void* dst, size_t bytes, cudaStream_t stream);

}  // namespace tailserve::cuda
