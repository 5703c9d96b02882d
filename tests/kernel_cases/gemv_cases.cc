// Gemv on odd sizes with each epilogue: plain; the residual add with bias and the output's sum of
// squares; the RMSNorm of an fp32 input from its sum of squares; that and SwiGLU. k 200 to 4096
// with n = 77 split 1, 2, 4 and 8 ways (the grid fits a wave; a lane keeps two steps of W loads:
// 129, 257 and 512 16-byte vectors) and n = 20001, which overflows a wave of an H200 whatever the
// split and takes the finest such split (2 for k = 1032). The small grids run the deep instances
// where a lane has 4 or more steps (batches of 4 and a ragged remainder), n = 20001 the
// 40-register ones. Each with W's first loads through shared memory or not, and Gemv's own k
// split or each one forced.
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/kernel_cases/case_buffers.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/kernels/gemv.h"

namespace tailserve::kernel_cases {
namespace {

constexpr float kEps = 1e-5f;
enum Mode { kPlain, kResidual, kNormed, kNormedSwiGlu };

class GemvCase final : public KernelCase {
 public:
  static absl::StatusOr<std::unique_ptr<KernelCase>> Make(int k, int n_odd, Mode mode, bool preload, int split,
                                                          uint32_t seed) {
    std::unique_ptr<GemvCase> c(new GemvCase());
    const bool residual = mode == kResidual, normed = mode >= kNormed, swiglu = mode == kNormedSwiGlu;
    const int n = swiglu ? n_odd + 1 : n_odd;
    c->k_ = k, c->n_ = n, c->mode_ = mode;
    std::mt19937 rng(seed);
    std::vector<float> xf = Random(size_t(k), rng), wf = Random(size_t(n) * k, rng, 0.05f);
    c->y0_ = Random(size_t(n), rng);
    const std::vector<float> bias = Random(size_t(n), rng);
    const std::vector<__half> wh = RoundToHalf(wf);
    const std::vector<__half> xh = normed ? std::vector<__half>(xf.size()) : RoundToHalf(xf);  // normed: fp32 x
    float in_ss = 0.0f;
    for (int i = 0; i < k; ++i) in_ss += xf[i] * xf[i];
    TAILSERVE_ASSIGN_OR_RETURN(c->x_, DeviceBuffer<__half>::Of(xh));
    TAILSERVE_ASSIGN_OR_RETURN(c->w_, DeviceBuffer<__half>::Of(wh));
    TAILSERVE_ASSIGN_OR_RETURN(c->act_, DeviceBuffer<__half>::Zeros(size_t(n) / 2));
    TAILSERVE_ASSIGN_OR_RETURN(c->xf_, DeviceBuffer<float>::Of(xf));
    TAILSERVE_ASSIGN_OR_RETURN(c->y_, DeviceBuffer<float>::Of(c->y0_));
    TAILSERVE_ASSIGN_OR_RETURN(c->bias_, DeviceBuffer<float>::Of(bias));
    TAILSERVE_ASSIGN_OR_RETURN(c->in_ss_, DeviceBuffer<float>::Of({in_ss}));
    TAILSERVE_ASSIGN_OR_RETURN(c->out_ss_, DeviceBuffer<float>::Zeros(1));
    c->want_y_.resize(size_t(n));
    c->want_ss_ = {0.0f};
    const double inv = normed ? 1.0 / std::sqrt(in_ss / k + kEps) : 1.0;
    for (int col = 0; col < n; ++col) {
      double d = 0;
      for (int i = 0; i < k; ++i) d += double(xf[i]) * wf[size_t(col) * k + i];
      d *= inv;
      if (residual) d += bias[col] + c->y0_[col];
      c->want_y_[col] = float(d);
      c->want_ss_[0] += float(d * d);
    }
    if (swiglu) {
      c->want_act_.resize(size_t(n) / 2);
      for (int f = 0; f < n / 2; ++f) {
        const double g = c->want_y_[2 * f], u = c->want_y_[2 * f + 1];
        c->want_act_[f] = float(g / (1 + std::exp(-g)) * u);
      }
    }
    c->args_ = {.k = k, .w = c->w_.get(), .n = n, .preload_w = preload, .k_split = split};
    if (normed) {
      c->args_.x_f32 = c->xf_.get(), c->args_.in_sumsq = c->in_ss_.get(), c->args_.eps = kEps;
    } else {
      c->args_.x = c->x_.get();
    }
    if (swiglu) {
      c->args_.swiglu_out = c->act_.get();
    } else {
      c->args_.y = c->y_.get();
    }
    if (residual) c->args_.beta = 1.0f, c->args_.bias = c->bias_.get(), c->args_.out_sumsq = c->out_ss_.get();
    return std::unique_ptr<KernelCase>(std::move(c));
  }

  absl::Status Reset() override {
    TAILSERVE_RETURN_IF_ERROR(y_.Put(y0_));
    return out_ss_.Put({0.0f});
  }
  absl::Status Launch(cudaStream_t stream) override { return cuda::Gemv(args_, stream); }
  absl::StatusOr<std::vector<Comparison>> Compare() override {
    std::vector<Comparison> out;
    if (mode_ == kNormedSwiGlu) {
      TAILSERVE_ASSIGN_OR_RETURN(const std::vector<__half> act, act_.Get());
      out.push_back({"act (relative L2, fp16)", RelativeL2(ToFloats(act), want_act_), 2e-3});
    } else {
      TAILSERVE_ASSIGN_OR_RETURN(const std::vector<float> y, y_.Get());
      out.push_back({"y (relative L2)", RelativeL2(y, want_y_), 1e-5});
    }
    if (mode_ == kResidual) {
      TAILSERVE_ASSIGN_OR_RETURN(const std::vector<float> ss, out_ss_.Get());
      out.push_back({"sum of squares (relative L2)", RelativeL2(ss, want_ss_), 1e-5});
    }
    return out;
  }
  double bytes() const override { return 2.0 * n_ * k_ + 4.0 * k_ + 4.0 * n_ * (mode_ == kResidual ? 3 : 1); }

 private:
  GemvCase() = default;
  int k_ = 0, n_ = 0;
  Mode mode_ = kPlain;
  std::vector<float> y0_, want_y_, want_act_, want_ss_;
  DeviceBuffer<__half> x_, w_, act_;
  DeviceBuffer<float> xf_, y_, bias_, in_ss_, out_ss_;
  cuda::GemvArgs args_;
};

}  // namespace

std::vector<CaseSpec> GemvCases(uint32_t seed) {
  static const char* kModeNames[] = {"plain", "residual", "normed", "normed swiglu"};
  std::vector<CaseSpec> specs;
  for (auto [k, n_odd] : {std::pair{200, 77}, {1032, 77}, {2056, 77}, {4096, 77}, {1032, 20001}}) {
    for (Mode mode : {kPlain, kResidual, kNormed, kNormedSwiGlu}) {
      for (auto [preload, split] : {std::pair{false, 0}, {true, 0}, {false, 1}, {false, 2}, {true, 4}, {false, 8}}) {
        const uint32_t case_seed = seed + static_cast<uint32_t>(specs.size());
        specs.push_back({absl::StrCat("gemv k ", k, " n ", n_odd, " ", kModeNames[mode], preload ? " preload" : "",
                                      " k split ", split, " seed ", case_seed),
                         [=] { return GemvCase::Make(k, n_odd, mode, preload, split, case_seed); }});
      }
    }
  }
  return specs;
}

}  // namespace tailserve::kernel_cases
