#include "router/prefix_index.h"

#include <string_view>

#include "common/block_hash.h"

namespace tailserve {

PrefixIndex::PrefixIndex(size_t workers, size_t capacity_blocks) : capacity_(capacity_blocks), sets_(workers) {}

std::vector<uint64_t> PrefixIndex::Hashes(std::span<const int32_t> tokens, bool leave_last) const {
  static const uint64_t salt = BlockHashSalt(std::string_view("router"));
  const size_t usable = leave_last && !tokens.empty() ? tokens.size() - 1 : tokens.size();
  std::vector<uint64_t> hashes;
  uint64_t h = salt;
  for (size_t b = 0; (b + 1) * kBlockTokens <= usable; ++b) {
    h = ChainBlockHash(h, tokens.subspan(b * kBlockTokens, kBlockTokens));
    hashes.push_back(h);
  }
  return hashes;
}

std::vector<int64_t> PrefixIndex::Overlap(std::span<const int32_t> tokens) const {
  const std::vector<uint64_t> hashes = Hashes(tokens, /*leave_last=*/true);
  std::vector<int64_t> out(sets_.size(), 0);
  for (size_t w = 0; w < sets_.size(); ++w) {
    size_t b = 0;
    while (b < hashes.size() && sets_[w].at.count(hashes[b])) ++b;
    out[w] = static_cast<int64_t>(b) * kBlockTokens;
  }
  return out;
}

void PrefixIndex::Record(size_t worker, std::span<const int32_t> tokens) {
  Set& s = sets_[worker];
  for (uint64_t h : Hashes(tokens, /*leave_last=*/false)) {
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
