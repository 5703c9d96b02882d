#pragma once
// A kernel launch written once and run two ways: the GPU tests launch it and compare its outputs
// with a CPU reference within the case's tolerance (check mode, tests/cuda_*_test.cc); the kernel
// bench replays it as a graph and reports its time beside the bytes it must move (perf mode,
// `tailserve-bench-kernels --cases`). A case draws its inputs from its seed (fp16-rounded where
// the kernel reads fp16, so the reference sees the same values), computes its reference when made,
// and owns its device buffers. Plain C++ over the kernels' headers: the program that links it
// brings the kernels (the engine's build or the kernel bench's).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tailserve::kernel_cases {

// One output of a case against its reference.
struct Comparison {
  std::string output;  // which output
  double error = 0;    // as the case measures it (relative L2, or the worst element's relative error)
  double tolerance = 0;
  bool ok() const { return error <= tolerance; }
};

class KernelCase {
 public:
  virtual ~KernelCase() = default;
  // Restores what a launch reads and accumulates into (a residual, written-back inputs), so that
  // a launch after it computes what the reference computed.
  virtual absl::Status Reset() = 0;
  // One launch on `stream`: no allocation, no synchronisation (a graph captures it).
  virtual absl::Status Launch(cudaStream_t stream) = 0;
  // After Reset and one Launch (synchronised by the caller): each output against the reference.
  virtual absl::StatusOr<std::vector<Comparison>> Compare() = 0;
  // Bytes one launch must read and write: its floor at the card's copy rate.
  virtual double bytes() const = 0;
};

// A case's name (its shape and variant, and the seed) and how to make it: cases are made one at a
// time, so a family's device memory is one case's.
struct CaseSpec {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<KernelCase>>()> make;
};

// The families. Each takes the seed its cases' inputs derive from.
std::vector<CaseSpec> RmsNormCases(uint32_t seed);  // RmsNormRows: odd sizes, 0-3 residual partials
std::vector<CaseSpec> GemvCases(uint32_t seed);     // Gemv: its epilogues, W preloads and k splits
std::vector<CaseSpec> SwiGluCases(uint32_t seed);   // SwiGlu: from gate/up or from 1-4 split-K chunks
std::vector<CaseSpec> MoeRowCases(uint32_t seed);   // MoeRouterLogits and AddScaledRows, around 128 rows
std::vector<CaseSpec> StreamGemmCases(uint32_t seed);  // StreamGemm: rows, chunks, variants, CTAs, rings
// Every family, for the kernel bench.
std::vector<CaseSpec> AllCases(uint32_t seed);

// Check mode: make, reset, launch, synchronise, compare. The comparisons, or the error that
// stopped the case.
absl::StatusOr<std::vector<Comparison>> RunCheck(const CaseSpec& spec, cudaStream_t stream);

}  // namespace tailserve::kernel_cases
