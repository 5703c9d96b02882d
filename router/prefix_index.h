#pragma once
// Cache-aware placement's view of the workers' prefix caches, learned from the router's own
// placements (the approximate mode: a worker's evictions are not seen, so each worker's set is
// bounded and forgets the least recently routed blocks first). Blocks are the workers' (16 tokens,
// hashes chained over every earlier token, common/block_hash.h), so the overlap it reports is the
// prefill a worker would skip. Owned by the router's core thread.
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace tailserve {

class PrefixIndex {
 public:
  static constexpr int kBlockTokens = 16;
  PrefixIndex(size_t workers, size_t capacity_blocks);

  // A prompt's chained full-block hashes, computed once for its Overlap and its Record.
  struct Blocks {
    std::vector<uint64_t> hashes;
    size_t tokens = 0;
  };
  static Blocks Hash(std::span<const int32_t> tokens);

  // For each worker, the leading tokens of the prompt it probably holds (whole blocks, leaving the
  // last token, which is always computed).
  std::vector<int64_t> Overlap(const Blocks& prompt) const;
  // The prompt was sent to `worker`: its cache will hold the prompt's full blocks.
  void Record(size_t worker, const Blocks& prompt);
  size_t blocks(size_t worker) const { return sets_[worker].lru.size(); }

 private:
  struct Set {
    std::list<uint64_t> lru;  // most recently routed at the back
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> at;
  };
  size_t capacity_;
  std::vector<Set> sets_;
};

}  // namespace tailserve
