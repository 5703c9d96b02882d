#include "tests/kernel_cases/kernel_case.h"

#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_check.h"

namespace tailserve::kernel_cases {

std::vector<CaseSpec> AllCases(uint32_t seed) {
  std::vector<CaseSpec> all = RmsNormCases(seed);
  for (auto family : {GemvCases, SwiGluCases, MoeRowCases, StreamGemmCases}) {
    for (CaseSpec& c : family(seed)) all.push_back(std::move(c));
  }
  return all;
}

absl::StatusOr<std::vector<Comparison>> RunCheck(const CaseSpec& spec, cudaStream_t stream) {
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<KernelCase> c, spec.make());
  TAILSERVE_RETURN_IF_ERROR(c->Reset());
  TAILSERVE_RETURN_IF_ERROR(c->Launch(stream));
  TAILSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return c->Compare();
}

}  // namespace tailserve::kernel_cases
