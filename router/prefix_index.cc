#include "router/prefix_index.h"

#include <string_view>

#include "common/block_hash.h"

namespace tailserve {

PrefixIndex::PrefixIndex(size_t workers, size_t capacity_blocks) : capacity_(capacity_blocks), sets_(workers) {}

PrefixIndex::Blocks PrefixIndex::Hash(std::span<const int32_t> tokens) {
  static const uint64_t salt = BlockHashSalt(std::string_view("router"));
  Blocks out;
  out.tokens = tokens.size();
  uint64_t h = salt;
  for (size_t b = 0; (b + 1) * kBlockTokens <= tokens.size(); ++b) {
    h = ChainBlockHash(h, tokens.subspan(b * kBlockTokens, kBlockTokens));
    out.hashes.push_back(h);
  }
  return out;
}

std::vector<int64_t> PrefixIndex::Overlap(const Blocks& prompt) const {
  const size_t usable = prompt.tokens > 0 ? (prompt.tokens - 1) / kBlockTokens : 0;
  std::vector<int64_t> out(sets_.size(), 0);
  for (size_t w = 0; w < sets_.size(); ++w) {
    size_t b = 0;
    while (b < usable && sets_[w].at.count(prompt.hashes[b])) ++b;
    out[w] = static_cast<int64_t>(b) * kBlockTokens;
  }
  return out;
}

void PrefixIndex::Record(size_t worker, const Blocks& prompt) {
  Set& s = sets_[worker];
  for (uint64_t h : prompt.hashes) {
    if (auto it = s.at.find(h); it != s.at.end()) {
      s.lru.splice(s.lru.end(), s.lru, it->second);
      continue;
    }
    s.at[h] = s.lru.insert(s.lru.end(), h);
    if (s.lru.size() > capacity_) {
      s.at.erase(s.lru.front());
      s.lru.pop_front();
    }
  }
}

}  // namespace tailserve
