// --cases: the kernel cases the GPU tests check (tests/kernel_cases/), timed: each case's launch
// replayed in a graph, beside the bytes it must move at the H200's copy rate. A case is checked
// once first, so a number is never reported for a launch that computes the wrong thing.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "bench/kernels/modes.h"
#include "common/status_macros.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/cuda_check.h"

namespace tailserve::bench {

absl::Status BenchKernelCases(const BenchConfig& c) {
  std::printf("| case | checked | µs | GB/s | bytes at 4.26 TB/s µs |\n|---|---|---:|---:|---:|\n");
  for (const kernel_cases::CaseSpec& spec : kernel_cases::AllCases(/*seed=*/1)) {
    TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<kernel_cases::KernelCase> kc, spec.make());
    TAILSERVE_RETURN_IF_ERROR(kc->Reset());
    TAILSERVE_RETURN_IF_ERROR(kc->Launch(c.stream));
    TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(c.stream));
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<kernel_cases::Comparison> checks, kc->Compare());
    bool ok = true;
    for (const kernel_cases::Comparison& check : checks) ok = ok && check.ok();
    TAILSERVE_ASSIGN_OR_RETURN(const double us, TimeGraph(c.stream, c.reps, [&] { return kc->Launch(c.stream); }));
    std::printf("| %s | %s | %.2f | %.0f | %.2f |\n", spec.name.c_str(), ok ? "ok" : "WRONG", us,
                kc->bytes() / (us * 1e-6) / 1e9, kc->bytes() / kCopyBandwidth * 1e6);
  }
  return absl::OkStatus();
}

}  // namespace tailserve::bench
