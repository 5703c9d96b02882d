#include "worker/step_cost_model.h"

#include <algorithm>
#include <cmath>

namespace tailserve {
namespace {

// Features scaled to similar magnitudes (sequences ~10², KV tokens ~10⁵, prefill tokens ~10³),
// so the normal equations stay well conditioned.
constexpr double kSeqScale = 1e-2, kKvScale = 1e-5, kPrefillScale = 1e-3;

}  // namespace

StepCostModel::StepCostModel(double forgetting) : forgetting_(forgetting) {}

void StepCostModel::Observe(int sequences, int64_t kv_tokens, int64_t prefill_tokens, double seconds) {
  const std::array<double, kTerms> x = {1.0, sequences * kSeqScale, static_cast<double>(kv_tokens) * kKvScale,
                                        static_cast<double>(prefill_tokens) * kPrefillScale};
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) xtx_[i][j] = forgetting_ * xtx_[i][j] + x[i] * x[j];
    xty_[i] = forgetting_ * xty_[i] + x[i] * seconds;
  }
  ++steps_;
  ++(prefill_tokens > 0 ? prefill_steps_ : decode_steps_);
}

std::optional<StepCostModel::Fit> StepCostModel::fit() const {
  if (steps_ < kMinSteps || prefill_steps_ < kMinSteps / 4 || decode_steps_ < kMinSteps / 4) return std::nullopt;
  // Solve (XᵀX + λI)·w = Xᵀy by Gaussian elimination with partial pivoting; the small ridge keeps
  // a term the steps have not varied (say, always 64 sequences) from taking an arbitrary value.
  std::array<std::array<double, kTerms + 1>, kTerms> m{};
  double trace = 0;
  for (int i = 0; i < kTerms; ++i) trace += xtx_[i][i];
  const double ridge = 1e-9 * trace;
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) m[i][j] = xtx_[i][j] + (i == j ? ridge : 0);
    m[i][kTerms] = xty_[i];
  }
  for (int col = 0; col < kTerms; ++col) {
    int pivot = col;
    for (int r = col + 1; r < kTerms; ++r) {
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    }
    if (std::abs(m[pivot][col]) < 1e-300) return std::nullopt;
    std::swap(m[col], m[pivot]);
    for (int r = 0; r < kTerms; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int k = col; k <= kTerms; ++k) m[r][k] -= f * m[col][k];
    }
  }
  Fit f;
  f.a = m[0][kTerms] / m[0][0];
  f.b = m[1][kTerms] / m[1][1] * kSeqScale;
  f.c = m[2][kTerms] / m[2][2] * kKvScale;
  f.p = m[3][kTerms] / m[3][3] * kPrefillScale;
  return f;
}

std::optional<int64_t> StepCostModel::PrefillTokensWithin(double target_seconds, int sequences,
                                                          int64_t cached_tokens) const {
  const std::optional<Fit> f = fit();
  if (!f) return std::nullopt;
  const double per_token = f->p + f->c;  // a prefill token adds its own KV position too
  if (per_token <= 0) return std::nullopt;
  const double fixed = f->a + f->b * sequences + f->c * static_cast<double>(cached_tokens);
  return std::max<int64_t>(0, static_cast<int64_t>(std::floor((target_seconds - fixed) / per_token)));
}

}  // namespace tailserve
