#include "worker/engine/sampling.h"

#include <algorithm>
#include <cmath>

#include "common/splitmix.h"

namespace tailserve {
namespace {

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

int32_t SampleToken(std::span<const float> logits, const Sampling& s, int64_t position,
                    std::vector<std::pair<float, int32_t>>* scratch) {
  if (!(s.temperature > 0) || s.top_k == 1) return Argmax(logits);  // NaN: greedy, like the GPU sampler
  auto& cand = *scratch;
  cand.clear();
  cand.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) cand.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  if (cand.empty()) return Argmax(logits);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = cand.size();
  if (s.top_k > 0 && static_cast<size_t>(s.top_k) < keep) {
    keep = static_cast<size_t>(s.top_k);
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keep), cand.end(), by_logit);
    cand.resize(keep);
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  // Softmax at the temperature over the survivors (sorted, largest first). The max comes off
  // before the division: a tiny temperature then gives the best token weight 1 and the rest 0,
  // where logit / temperature would overflow to inf and inf - inf to NaN.
  const double max = cand.front().first;
  double total = 0;
  for (auto& c : cand) {
    c.first = static_cast<float>(std::exp((c.first - max) / s.temperature));
    total += c.first;
  }
  if (s.top_p < 1) {
    // Smallest prefix whose mass reaches top_p (always at least one token).
    double mass = 0;
    size_t n = 0;
    while (n < cand.size()) {
      mass += cand[n].first / total;
      ++n;
      if (mass >= s.top_p) break;
    }
    cand.resize(n);
    total = 0;
    for (auto& c : cand) total += c.first;
  }
  const double u = SampleUniform(s.seed, position) * total;
  double acc = 0;
  for (const auto& c : cand) {
    acc += c.first;
    if (u < acc) return c.second;
  }
  return cand.back().second;
}

void ComputeLogprobs(std::span<const float> logits, int32_t token, int32_t top, TokenLogprobs* out) {
  float max = -INFINITY;
  for (const float l : logits) {
    if (std::isfinite(l)) max = std::max(max, l);
  }
  double sum = 0;
  for (const float l : logits) {
    if (std::isfinite(l)) sum += std::exp(static_cast<double>(l) - max);
  }
  const double lse = max + std::log(sum);
  auto logprob = [&](float l) { return std::isfinite(l) ? static_cast<float>(l - lse) : -INFINITY; };
  out->logprob = token >= 0 && static_cast<size_t>(token) < logits.size() ? logprob(logits[token]) : -INFINITY;
  out->top.clear();
  if (top <= 0) return;
  // A running list of the best `top`, kept sorted: one pass, no copy of the vocabulary.
  auto before = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) continue;
    const std::pair<int32_t, float> c(static_cast<int32_t>(i), logits[i]);
    if (out->top.size() == static_cast<size_t>(top) && !before(c, out->top.back())) continue;
    out->top.insert(std::upper_bound(out->top.begin(), out->top.end(), c, before), c);
    if (out->top.size() > static_cast<size_t>(top)) out->top.pop_back();
  }
  for (auto& [id, l] : out->top) l = logprob(l);
}

}  // namespace tailserve
