// Row kernels beside the RMSNorm: SwiGLU (from gate/up, or from split-K chunks that sum to it) and
// the MoE path's router logits and weighted expert adds, on odd sizes.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/kernel_cases/case_buffers.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/kernels/rows.h"

namespace tailserve::kernel_cases {
namespace {

// act = silu(gate) · up, gate and up interleaved; with `chunks` > 0 the input comes as that many
// arrays (16-byte aligned, a stride apart) that sum to it, as a split-K projection leaves it.
class SwiGluCase final : public KernelCase {
 public:
  static absl::StatusOr<std::unique_ptr<KernelCase>> Make(int rows, int ffn, int chunks, uint32_t seed) {
    std::unique_ptr<SwiGluCase> c(new SwiGluCase(rows, ffn, chunks));
    std::mt19937 rng(seed);
    const std::vector<float> gu = Random(size_t(rows) * 2 * ffn, rng, 2.0f);
    c->stride_ = int64_t((gu.size() + 3) / 4 * 4 + 4);
    std::vector<float> parts(size_t(c->stride_) * std::max(chunks, 1), std::nanf(""));
    for (size_t i = 0; i < gu.size() && chunks > 0; ++i) {
      float rest = gu[i];
      for (int p = 0; p + 1 < chunks; ++p) {
        const float v = p % 2 ? -0.5f : 0.25f * gu[i];
        parts[size_t(p) * c->stride_ + i] = v, rest -= v;
      }
      parts[size_t(chunks - 1) * c->stride_ + i] = rest;
    }
    TAILSERVE_ASSIGN_OR_RETURN(c->gu_, DeviceBuffer<float>::Of(gu));
    TAILSERVE_ASSIGN_OR_RETURN(c->parts_, DeviceBuffer<float>::Of(parts));
    TAILSERVE_ASSIGN_OR_RETURN(c->out_, DeviceBuffer<__half>::Zeros(size_t(rows) * ffn));
    c->want_.resize(size_t(rows) * ffn);
    for (int r = 0; r < rows; ++r) {
      for (int f = 0; f < ffn; ++f) {
        const float g = gu[size_t(r) * 2 * ffn + 2 * f], u = gu[size_t(r) * 2 * ffn + 2 * f + 1];
        c->want_[size_t(r) * ffn + f] = g / (1 + std::exp(-g)) * u;
      }
    }
    return std::unique_ptr<KernelCase>(std::move(c));
  }
  absl::Status Reset() override { return absl::OkStatus(); }
  absl::Status Launch(cudaStream_t stream) override {
    if (chunks_ == 0) return cuda::SwiGlu(gu_.get(), rows_, ffn_, out_.get(), stream);
    return cuda::SwiGlu(nullptr, rows_, ffn_, out_.get(), stream, false,
                        {.data = parts_.get(), .count = chunks_, .stride = stride_});
  }
  absl::StatusOr<std::vector<Comparison>> Compare() override {
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<__half> out, out_.Get());
    return std::vector<Comparison>{{"act (relative L2, fp16)", RelativeL2(ToFloats(out), want_), 4e-3}};
  }
  double bytes() const override { return double(rows_) * ffn_ * (8.0 * std::max(chunks_, 1) + 2); }

 private:
  SwiGluCase(int rows, int ffn, int chunks) : rows_(rows), ffn_(ffn), chunks_(chunks) {}
  int rows_, ffn_, chunks_;
  int64_t stride_ = 0;
  std::vector<float> want_;
  DeviceBuffer<float> gu_, parts_;
  DeviceBuffer<__half> out_;
};

// The MoE router in fp32 (MoeRouterLogits: each row's RMSNorm times the router), then one
// expert's weighted add into the residual (AddScaledRows: rows it did not route to, weight 0,
// are left alone), as the MoE layer runs them.
class MoeRowsCase final : public KernelCase {
 public:
  static absl::StatusOr<std::unique_ptr<KernelCase>> Make(int rows, int hidden, int experts, uint32_t seed) {
    std::unique_ptr<MoeRowsCase> c(new MoeRowsCase(rows, hidden, experts));
    std::mt19937 rng(seed);
    const std::vector<float> x = Random(size_t(rows) * hidden, rng, 2.0f), norm = Random(size_t(hidden), rng);
    const std::vector<float> router = Random(size_t(experts) * hidden, rng, 0.1f);
    c->y_host_ = Random(size_t(rows) * hidden, rng);
    c->weights_host_ = Random(size_t(rows) * experts, rng);
    for (int r = 0; r < rows; r += 3) c->weights_host_[size_t(r) * experts + kExpert] = 0.0f;  // not routed here
    c->residual0_ = Random(size_t(rows) * hidden, rng);
    TAILSERVE_ASSIGN_OR_RETURN(c->x_, DeviceBuffer<float>::Of(x));
    TAILSERVE_ASSIGN_OR_RETURN(c->norm_, DeviceBuffer<float>::Of(norm));
    TAILSERVE_ASSIGN_OR_RETURN(c->router_, DeviceBuffer<float>::Of(router));
    TAILSERVE_ASSIGN_OR_RETURN(c->logits_, DeviceBuffer<float>::Zeros(size_t(rows) * experts));
    TAILSERVE_ASSIGN_OR_RETURN(c->y_, DeviceBuffer<float>::Of(c->y_host_));
    TAILSERVE_ASSIGN_OR_RETURN(c->weights_, DeviceBuffer<float>::Of(c->weights_host_));
    TAILSERVE_ASSIGN_OR_RETURN(c->residual_, DeviceBuffer<float>::Of(c->residual0_));
    c->want_logits_.resize(size_t(rows) * experts);
    c->want_residual_ = c->residual0_;
    for (int r = 0; r < rows; ++r) {
      const float* xr = x.data() + size_t(r) * hidden;
      double ss = 0;
      for (int i = 0; i < hidden; ++i) ss += double(xr[i]) * xr[i];
      const double inv = 1 / std::sqrt(ss / hidden + kEps);
      for (int e = 0; e < experts; ++e) {
        double d = 0;
        for (int i = 0; i < hidden; ++i) d += norm[i] * (xr[i] * inv) * router[size_t(e) * hidden + i];
        c->want_logits_[size_t(r) * experts + e] = float(d);
      }
      const float w = c->weights_host_[size_t(r) * experts + kExpert];
      for (int i = 0; i < hidden; ++i) c->want_residual_[size_t(r) * hidden + i] += w * c->y_host_[size_t(r) * hidden + i];
    }
    return std::unique_ptr<KernelCase>(std::move(c));
  }
  absl::Status Reset() override { return residual_.Put(residual0_); }
  absl::Status Launch(cudaStream_t stream) override {
    TAILSERVE_RETURN_IF_ERROR(cuda::MoeRouterLogits(x_.get(), rows_, hidden_, norm_.get(), kEps, router_.get(),
                                                    experts_, logits_.get(), stream));
    return cuda::AddScaledRows(residual_.get(), y_.get(), weights_.get() + kExpert, experts_, rows_, hidden_, stream);
  }
  absl::StatusOr<std::vector<Comparison>> Compare() override {
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<float> logits, logits_.Get());
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<float> residual, residual_.Get());
    // fp32 throughout: the router's top-k must break near-ties as fp32 maths does.
    return std::vector<Comparison>{{"router logits (worst element)", WorstElement(logits, want_logits_), 1e-5},
                                   {"residual after the expert's add (worst element)",
                                    WorstElement(residual, want_residual_), 1e-6}};
  }
  double bytes() const override { return double(rows_) * hidden_ * 4 * 4 + double(experts_) * hidden_ * 4; }

 private:
  static constexpr float kEps = 1e-5f;
  static constexpr int kExpert = 1;  // the expert whose add is checked
  MoeRowsCase(int rows, int hidden, int experts) : rows_(rows), hidden_(hidden), experts_(experts) {}
  int rows_, hidden_, experts_;
  std::vector<float> y_host_, weights_host_, residual0_, want_logits_, want_residual_;
  DeviceBuffer<float> x_, norm_, router_, logits_, y_, weights_, residual_;
};

}  // namespace

std::vector<CaseSpec> SwiGluCases(uint32_t seed) {
  std::vector<CaseSpec> specs;
  for (int rows : {1, 19, 64}) {
    for (int ffn : {173, 1024, 14336}) {
      for (int chunks : {0, 1, 3, 4}) {
        const uint32_t case_seed = seed + static_cast<uint32_t>(specs.size());
        specs.push_back({absl::StrCat("swiglu rows ", rows, " ffn ", ffn, " chunks ", chunks, " seed ", case_seed),
                         [=] { return SwiGluCase::Make(rows, ffn, chunks, case_seed); }});
      }
    }
  }
  return specs;
}

std::vector<CaseSpec> MoeRowCases(uint32_t seed) {
  std::vector<CaseSpec> specs;
  for (int rows : {1, 3, 128, 129}) {
    for (auto [hidden, experts] : {std::pair{192, 4}, {256, 8}, {4096, 8}}) {
      const uint32_t case_seed = seed + static_cast<uint32_t>(specs.size());
      specs.push_back({absl::StrCat("moe rows ", rows, " hidden ", hidden, " experts ", experts, " seed ", case_seed),
                       [=] { return MoeRowsCase::Make(rows, hidden, experts, case_seed); }});
    }
  }
  return specs;
}

}  // namespace tailserve::kernel_cases
