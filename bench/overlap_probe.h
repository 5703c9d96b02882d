#pragma once
// A kernel that only streams bytes from DRAM, for the kernel bench's --overlap probe: can o's
// weights stream on the SMs the batch-16 attention leaves room on, while it runs?
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace tailserve::bench {

// Reads `bytes` (a multiple of 16) from `data` with `ctas` CTAs of 256 threads, 8 loads of 16 bytes
// in flight a thread; writes `sink` only if the bytes XOR to a value they never do.
absl::Status StreamRead(const void* data, size_t bytes, int ctas, unsigned* sink, cudaStream_t stream);

}  // namespace tailserve::bench
