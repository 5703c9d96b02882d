#pragma once
// Cache-aware placement's view of the workers' prefix caches. Blocks are the workers' (16 tokens,
// hashes chained over every earlier token, common/block_hash.h), so the overlap it reports is the
// prefill a worker would skip. Two sources, per worker:
//  - its events (ApplyEvents: the blocks its cache stored and evicted, under its own salt; the
//    exact mode), once it sends them: evictions are seen, and router replicas agree;
//  - the router's own placements (Record): without events, a bounded set forgetting the least
//    recently routed first (the approximate mode); with events, only for `recent` after the
//    placement, until the worker's next events can show the blocks it then computed.
// Owned by the router's core thread.
#include <chrono>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"

namespace tailserve {

class PrefixIndex {
 public:
  static constexpr int kBlockTokens = 16;
  PrefixIndex(size_t workers, size_t capacity_blocks, std::chrono::milliseconds recent = std::chrono::seconds(2));

  // A prompt's tokens and its chained full-block hashes under the router's salt, computed once
  // for its Overlap and its Record.
  struct Blocks {
    std::vector<uint64_t> hashes;
    std::span<const int32_t> tokens;  // must outlive the Blocks
  };
  static Blocks Hash(std::span<const int32_t> tokens);

  // For each worker, the leading tokens of the prompt it probably holds (whole blocks, leaving the
  // last token, which is always computed).
  std::vector<int64_t> Overlap(const Blocks& prompt, SteadyTime now) const;
  // The prompt was sent to `worker`: its cache will hold the prompt's full blocks.
  void Record(size_t worker, const Blocks& prompt, SteadyTime now);
  // The worker's cache events: with `snapshot`, `stored` is all it holds. From then on the worker
  // is in the exact mode.
  void ApplyEvents(size_t worker, uint64_t salt, bool snapshot, std::span<const uint64_t> stored,
                   std::span<const uint64_t> removed);
  // The worker left (or restarted): forget what it held and its mode.
  void Forget(size_t worker);
  size_t blocks(size_t worker) const { return sets_[worker].lru.size() + sets_[worker].held.size(); }
  bool exact(size_t worker) const { return sets_[worker].exact; }

 private:
  struct Routed {
    uint64_t hash;
    SteadyTime at;
  };
  struct Set {
    std::list<Routed> lru;  // most recently routed at the back
    std::unordered_map<uint64_t, std::list<Routed>::iterator> at;
    bool exact = false;
    uint64_t salt = 0;
    std::unordered_set<uint64_t> held;  // from events, under `salt`
  };
  size_t capacity_;
  std::chrono::milliseconds recent_;
  std::vector<Set> sets_;
};

}  // namespace tailserve
