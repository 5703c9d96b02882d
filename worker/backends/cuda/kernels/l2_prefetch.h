#pragma once
// A strided set of byte ranges a latency-bound kernel asks L2 to fetch from DRAM while it runs,
// for the projection that follows it: the first k-blocks of every row (and k chunk) of that
// projection's W, the bytes each of its CTAs reads first. The kernels that take one
// (RmsNormRows, RopeWriteKv) issue it before their wait and never read it.
#include <cstdint>

namespace tailserve::cuda {

struct L2Prefetch {
  const void* base = nullptr;  // null or bytes == 0: none
  int rows = 0;
  int chunks = 1;             // ranges a row, chunk_bytes apart (a split-K projection's k chunks)
  int64_t row_bytes = 0;      // from one row's first range to the next's
  int64_t chunk_bytes = 0;
  int bytes = 0;              // each range: a multiple of 16, 16-byte aligned like base

  bool none() const { return base == nullptr || bytes == 0; }
  // What the bulk prefetch instruction requires of every range.
  bool valid() const {
    return none() || (reinterpret_cast<uintptr_t>(base) % 16 == 0 && bytes > 0 && bytes % 16 == 0 && rows >= 0 &&
                      chunks >= 1 && row_bytes % 16 == 0 && chunk_bytes % 16 == 0);
  }
};

}  // namespace tailserve::cuda
