#pragma once
// What a worker's prefix cache holds, as a stream the router can follow: each block published
// (stored) or evicted (removed), by its chained hash (common/block_hash.h, under the cache's salt).
// The scheduler's thread appends (through the allocator); the Status RPC reads from any thread. A
// reader passes the cursor it was last given and gets what changed since, compacted to each
// hash's last state; a reader that is new, fell behind the retained window or holds a cursor
// from before a restart gets a snapshot of every cached block instead. Router replicas each
// follow it on their own, so they agree on what a worker holds (Dynamo's KV events, SGLang's
// cache-aware router rebuilt from the workers).
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tailserve {

class KvEventLog {
 public:
  // `capacity`: events retained for readers that follow; older ones only reach a snapshot.
  KvEventLog(uint64_t salt, int block_size, size_t capacity = 1 << 16);

  void Stored(uint64_t hash);
  void Removed(uint64_t hash);

  struct Changes {
    uint64_t next = 0;       // the cursor to pass next time
    bool snapshot = false;   // stored is everything cached; forget what came before
    std::vector<uint64_t> stored, removed;
  };
  // Since `cursor` (0: a snapshot), at most `max_changes` hashes (more: a snapshot, which is
  // bounded by the cache itself).
  Changes Since(uint64_t cursor, size_t max_changes = 1 << 16) const;

  uint64_t salt() const { return salt_; }
  // Random per log: a cursor from another log (a restarted worker) must not be read in this one.
  uint64_t epoch() const { return epoch_; }
  int block_size() const { return block_size_; }
  size_t cached() const;

 private:
  const uint64_t salt_;
  const int block_size_;
  const uint64_t epoch_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<std::pair<uint64_t, bool>> events_;  // (hash, stored), oldest first
  uint64_t next_ = 1;                              // events_ holds [next_ - size, next_)
  std::unordered_set<uint64_t> cached_;
};

}  // namespace tailserve
