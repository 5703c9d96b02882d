#include "worker/engine/sampling.h"

#include <algorithm>
#include <cmath>

namespace tailserve {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

double SampleUniform(uint64_t seed, int64_t position) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(position));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t SampleToken(std::span<const float> logits, const Sampling& s, int64_t position,
                    std::vector<std::pair<float, int32_t>>* scratch) {
  if (s.temperature <= 0 || s.top_k == 1) return Argmax(logits);
  auto& cand = *scratch;
  cand.clear();
  cand.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) cand.emplace_back(logits[i] / s.temperature, static_cast<int32_t>(i));
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
  // Softmax over the survivors (sorted, largest first).
  const float max = cand.front().first;
  double total = 0;
  for (auto& c : cand) {
    c.first = std::exp(c.first - max);
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
