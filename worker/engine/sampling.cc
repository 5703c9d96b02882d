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

}  // namespace tailserve
