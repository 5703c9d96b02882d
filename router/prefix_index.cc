#include "router/prefix_index.h"

#include <string_view>

#include "common/block_hash.h"

namespace tailserve {

PrefixIndex::PrefixIndex(size_t workers, size_t capacity_blocks, std::chrono::milliseconds recent)
    : capacity_(capacity_blocks), recent_(recent), sets_(workers) {}

PrefixIndex::Blocks PrefixIndex::Hash(std::span<const int32_t> tokens) {
  static const uint64_t salt = BlockHashSalt(std::string_view("router"));
  return Blocks{ChainBlockHashes(salt, tokens, kBlockTokens), tokens};
}

std::vector<int64_t> PrefixIndex::Overlap(const Blocks& prompt, SteadyTime now) const {
  const size_t usable = !prompt.tokens.empty() ? (prompt.tokens.size() - 1) / kBlockTokens : 0;
  std::vector<int64_t> out(sets_.size(), 0);
  // The chain under a worker's salt, computed once per salt (workers of one model share it).
  std::unordered_map<uint64_t, std::vector<uint64_t>> salted;
  for (size_t w = 0; w < sets_.size(); ++w) {
    const Set& s = sets_[w];
    const std::vector<uint64_t>* mine = nullptr;
    if (s.exact) {
      auto [it, fresh] = salted.try_emplace(s.salt);
      if (fresh) it->second = ChainBlockHashes(s.salt, prompt.tokens.first(usable * kBlockTokens), kBlockTokens);
      mine = &it->second;
    }
    size_t b = 0;
    for (; b < usable; ++b) {
      if (mine && s.held.contains((*mine)[b])) continue;
      auto r = s.at.find(prompt.hashes[b]);
      if (r == s.at.end() || (s.exact && now - r->second->at > recent_)) break;
    }
    out[w] = static_cast<int64_t>(b) * kBlockTokens;
  }
  return out;
}

void PrefixIndex::Record(size_t worker, const Blocks& prompt, SteadyTime now) {
  Set& s = sets_[worker];
  for (uint64_t h : prompt.hashes) {
    if (auto it = s.at.find(h); it != s.at.end()) {
      it->second->at = now;
      s.lru.splice(s.lru.end(), s.lru, it->second);
      continue;
    }
    s.at[h] = s.lru.insert(s.lru.end(), Routed{h, now});
  }
  // Approximate: a bounded set. Exact: the events hold the cache; only recent placements count.
  while (!s.lru.empty() && (s.lru.size() > capacity_ || (s.exact && now - s.lru.front().at > recent_))) {
    s.at.erase(s.lru.front().hash);
    s.lru.pop_front();
  }
}

void PrefixIndex::ApplyEvents(size_t worker, uint64_t salt, bool snapshot, std::span<const uint64_t> stored,
                              std::span<const uint64_t> removed) {
  Set& s = sets_[worker];
  if (snapshot || !s.exact || s.salt != salt) s.held.clear();
  s.exact = true;
  s.salt = salt;
  for (uint64_t h : removed) s.held.erase(h);
  s.held.insert(stored.begin(), stored.end());
}

void PrefixIndex::Forget(size_t worker) { sets_[worker] = Set{}; }

}  // namespace tailserve
