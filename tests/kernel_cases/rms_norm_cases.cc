// RmsNormRows on odd sizes: rows 1, 3, 19; hidden 64, 200, 203 (the scalar path: not whole
// float4s) and 4096; 0, 1 or 3 residual partials added into x first and written back (their
// stride past the rows).
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/kernel_cases/case_buffers.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/kernels/rows.h"

namespace tailserve::kernel_cases {
namespace {

constexpr float kEps = 1e-5f;

class RmsNormCase final : public KernelCase {
 public:
  static absl::StatusOr<std::unique_ptr<KernelCase>> Make(int rows, int hidden, int adds, uint32_t seed) {
    std::unique_ptr<RmsNormCase> c(new RmsNormCase(rows, hidden, adds));
    std::mt19937 rng(seed);
    c->x0_ = Random(size_t(rows) * hidden, rng, 3.0f);
    c->stride_ = int64_t(c->x0_.size()) + 4;
    const std::vector<float> w = Random(hidden, rng), add = Random(size_t(c->stride_) * std::max(adds, 1), rng);
    TAILSERVE_ASSIGN_OR_RETURN(c->x_, DeviceBuffer<float>::Of(c->x0_));
    TAILSERVE_ASSIGN_OR_RETURN(c->w_, DeviceBuffer<float>::Of(w));
    TAILSERVE_ASSIGN_OR_RETURN(c->add_, DeviceBuffer<float>::Of(add));
    TAILSERVE_ASSIGN_OR_RETURN(c->out_, DeviceBuffer<__half>::Zeros(size_t(rows) * hidden));
    // The reference: x plus the partials, then each row over its RMS times the weight.
    c->want_x_ = c->x0_;
    for (int a = 0; a < adds; ++a) {
      for (size_t i = 0; i < c->want_x_.size(); ++i) c->want_x_[i] += add[a * c->stride_ + i];
    }
    c->want_out_.resize(c->want_x_.size());
    for (int r = 0; r < rows; ++r) {
      const float* xr = c->want_x_.data() + size_t(r) * hidden;
      double ss = 0;
      for (int i = 0; i < hidden; ++i) ss += double(xr[i]) * xr[i];
      const double inv = 1 / std::sqrt(ss / hidden + kEps);
      for (int i = 0; i < hidden; ++i) c->want_out_[size_t(r) * hidden + i] = float(w[i] * xr[i] * inv);
    }
    return std::unique_ptr<KernelCase>(std::move(c));
  }

  absl::Status Reset() override { return x_.Put(x0_); }
  absl::Status Launch(cudaStream_t stream) override {
    return cuda::RmsNormRows(x_.get(), {adds_ ? add_.get() : nullptr, adds_, stride_}, nullptr, rows_, hidden_,
                             w_.get(), kEps, out_.get(), stream);
  }
  absl::StatusOr<std::vector<Comparison>> Compare() override {
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<__half> out, out_.Get());
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<float> x, x_.Get());
    // fp16 output; x's sum is fp32 but the GPU adds in another order.
    return std::vector<Comparison>{{"out (relative L2)", RelativeL2(ToFloats(out), want_out_), 4e-3},
                                   {"x written back (worst element)", WorstElement(x, want_x_), 1e-5}};
  }
  double bytes() const override {
    const double elems = double(rows_) * hidden_;
    return elems * 4 * (adds_ ? 2 + adds_ : 1) + elems * 2 + hidden_ * 4.0;
  }

 private:
  RmsNormCase(int rows, int hidden, int adds) : rows_(rows), hidden_(hidden), adds_(adds) {}
  int rows_, hidden_, adds_;
  int64_t stride_ = 0;
  std::vector<float> x0_, want_x_, want_out_;
  DeviceBuffer<float> x_, w_, add_;
  DeviceBuffer<__half> out_;
};

}  // namespace

std::vector<CaseSpec> RmsNormCases(uint32_t seed) {
  std::vector<CaseSpec> specs;
  for (int rows : {1, 3, 19}) {
    for (int hidden : {64, 200, 203, 4096}) {
      for (int adds : {0, 1, 3}) {
        const uint32_t case_seed = seed + static_cast<uint32_t>(specs.size());
        specs.push_back({absl::StrCat("rmsnorm rows ", rows, " hidden ", hidden, " adds ", adds, " seed ", case_seed),
                         [=] { return RmsNormCase::Make(rows, hidden, adds, case_seed); }});
      }
    }
  }
  return specs;
}

}  // namespace tailserve::kernel_cases
