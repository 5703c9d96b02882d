// StreamGemm's k-chunk partials on odd sizes: rows 1, 3, 5 and 16 (its X tile is 16 rows,
// zero-filled past the real ones), n that leaves a part tile, 1 to 6 chunks, each item and stage
// shape (variants 0-4), fewer CTAs than an SM count (so a CTA takes many items) and smaller rings
// (1 byte asks for fewer than two stages and gets two). The partials start as NaN, so a chunk it
// does not write shows; the workspace must be left zeroed for the next launch.
#include <cmath>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "tests/kernel_cases/case_buffers.h"
#include "tests/kernel_cases/kernel_case.h"
#include "worker/backends/cuda/kernels/stream_gemm.h"

namespace tailserve::kernel_cases {
namespace {

class StreamGemmCase final : public KernelCase {
 public:
  static absl::StatusOr<std::unique_ptr<KernelCase>> Make(int rows, int n, int k, int chunks, int ctas, int variant,
                                                          int ring, uint32_t seed) {
    std::unique_ptr<StreamGemmCase> c(new StreamGemmCase());
    std::mt19937 rng(seed);
    std::vector<float> xf = Random(size_t(rows) * k, rng), wf = Random(size_t(n) * k, rng, 0.05f);
    const std::vector<__half> xh = RoundToHalf(xf), wh = RoundToHalf(wf);
    c->stride_ = int64_t(rows) * n + 4;  // not rows · n: the stride is what places a chunk
    c->nan_.assign(size_t(c->stride_) * chunks, std::nanf(""));
    TAILSERVE_ASSIGN_OR_RETURN(c->x_, DeviceBuffer<__half>::Of(xh));
    TAILSERVE_ASSIGN_OR_RETURN(c->w_, DeviceBuffer<__half>::Of(wh));
    TAILSERVE_ASSIGN_OR_RETURN(c->partials_, DeviceBuffer<float>::Of(c->nan_));
    TAILSERVE_ASSIGN_OR_RETURN(c->work_, DeviceBuffer<int>::Zeros(cuda::kStreamGemmWorkspaceBytes / sizeof(int)));
    c->rows_ = rows, c->n_ = n, c->k_ = k, c->chunks_ = chunks;
    c->args_ = {.x = c->x_.get(), .rows = rows, .k = k, .w = c->w_.get(), .n = n, .chunks = chunks,
                .partials = c->partials_.get(), .partial_stride = c->stride_, .workspace = c->work_.get(),
                .ctas = ctas, .max_ring_bytes = ring, .variant = variant};
    // Chunk ch's product over its k range, from the fp16 values the kernel reads.
    const int kc = k / chunks;
    c->want_.assign(size_t(rows) * n * chunks, 0.0f);
    for (int ch = 0; ch < chunks; ++ch) {
      for (int r = 0; r < rows; ++r) {
        for (int col = 0; col < n; ++col) {
          double d = 0;
          for (int i = ch * kc; i < (ch + 1) * kc; ++i) d += double(xf[size_t(r) * k + i]) * wf[size_t(col) * k + i];
          c->want_[(size_t(ch) * rows + r) * n + col] = float(d);
        }
      }
    }
    return std::unique_ptr<KernelCase>(std::move(c));
  }
  absl::Status Reset() override { return partials_.Put(nan_); }
  absl::Status Launch(cudaStream_t stream) override { return cuda::StreamGemm(args_, stream); }
  absl::StatusOr<std::vector<Comparison>> Compare() override {
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<float> got, partials_.Get());
    TAILSERVE_ASSIGN_OR_RETURN(const std::vector<int> work, work_.Get());
    std::vector<float> mine(want_.size());
    for (int ch = 0; ch < chunks_; ++ch) {
      std::copy_n(got.data() + size_t(ch) * stride_, size_t(rows_) * n_, mine.data() + size_t(ch) * rows_ * n_);
    }
    double dirty = 0;
    for (int v : work) dirty += v != 0;
    return std::vector<Comparison>{{"partials (relative L2)", RelativeL2(mine, want_), 1e-5},
                                   {"workspace counters left non-zero", dirty, 0}};
  }
  double bytes() const override { return 2.0 * n_ * k_ + 2.0 * rows_ * k_ + 4.0 * rows_ * n_ * chunks_; }

 private:
  StreamGemmCase() = default;
  int rows_ = 0, n_ = 0, k_ = 0, chunks_ = 0;
  int64_t stride_ = 0;
  std::vector<float> nan_, want_;
  DeviceBuffer<__half> x_, w_;
  DeviceBuffer<float> partials_;
  DeviceBuffer<int> work_;
  cuda::StreamGemmArgs args_;
};

}  // namespace

std::vector<CaseSpec> StreamGemmCases(uint32_t seed) {
  std::vector<CaseSpec> specs;
  for (auto [rows, n, k] : {std::tuple{1, 70, 384}, {3, 200, 384}, {16, 77, 768}, {16, 1000, 1536}, {5, 64, 64}}) {
    for (int chunks : {1, 2, 3, 6}) {
      if (k % (64 * chunks) != 0) continue;
      for (auto [ctas, variant, ring] : {std::tuple{0, 0, 0}, {7, 0, 0}, {0, 1, 0}, {0, 2, 0}, {7, 3, 0}, {0, 4, 0},
                                         {0, 1, 80 << 10}, {5, 0, 1}}) {
        if (k % (cuda::StreamGemmKStep(variant) * chunks) != 0) continue;
        const uint32_t case_seed = seed + static_cast<uint32_t>(specs.size());
        specs.push_back({absl::StrCat("stream_gemm rows ", rows, " n ", n, " k ", k, " chunks ", chunks, " ctas ",
                                      ctas, " variant ", variant, " ring ", ring, " seed ", case_seed),
                         [=] { return StreamGemmCase::Make(rows, n, k, chunks, ctas, variant, ring, case_seed); }});
      }
    }
  }
  return specs;
}

}  // namespace tailserve::kernel_cases
