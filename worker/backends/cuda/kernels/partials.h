#pragma once
// Fp32 arrays laid out like the buffer a kernel reads, `stride` floats apart, that the kernel sums
// into what it reads: the outputs of a GEMM whose k range was split into chunks
// (GemmRunner::RunSplitK), so the sum rides in a kernel that runs anyway instead of cuBLASLt's
// split-K reduce kernel.
#include <cstdint>

namespace tailserve::cuda {

// The most arrays a consumer adds: it holds all their loads in registers, issued before its first
// store (one round trip), so the bound is the kernels' register budget.
constexpr int kMaxPartials = 4;

struct Partials {
  const float* data = nullptr;  // null or count == 0: none
  int count = 0;
  int64_t stride = 0;  // floats from one array to the next

  // What a launcher passes its kernel: none where data is null or count is not positive.
  Partials OrNone() const { return data && count > 0 ? *this : Partials{}; }
};

}  // namespace tailserve::cuda
