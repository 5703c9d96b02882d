#pragma once
// The host side of the paged KV cache: which blocks are free, which are promised to admitted
// sequences, and each sequence's row of the block table the attention kernels read. Plain C++ (no
// CUDA), so it is tested on the CPU; the engine owns one and uploads the table rows it marks dirty
// (a backend without a device table passes an empty one: rows are then unlimited and unwritten).
// Block 0 is never handed out: padded graph rows write their K/V there, through the trash row.
//
// Prefix caching (with a salt): a full block, once computed, is published under its chained
// content hash (common/block_hash.h); a new sequence attaches the longest run of published blocks its
// tokens begin with and computes only the rest. Blocks are reference-counted: one in use is never
// taken; one nobody uses stays cached, and is evicted least recently used first when the pool
// needs a block and none is free.
// Not thread-safe: the scheduler's thread owns the engine and with it this allocator.
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/kv/kv_event_log.h"

namespace tailserve {

class KvBlockAllocator {
 public:
  struct Sequence {
    int table_row = -1;
    std::vector<int32_t> blocks;
    int64_t cached = 0;    // positions whose K/V the engine has written (the allocator never reads it)
    int64_t reserved = 0;  // blocks promised at admission (Reserve) and not yet taken
    int64_t hashed = 0;    // leading full blocks whose content hash is known (published or attached)
    uint64_t last_hash = 0;  // the chain hash of block hashed - 1
  };

  // `num_blocks` blocks of `block_size` positions (block 0 included), `max_sequences` table rows
  // of `max_blocks_per_seq` entries plus the trash row after them. `table` holds those rows
  // ((max_sequences + 1) · max_blocks_per_seq entries, zeroed here); the caller owns it (pinned
  // memory in the engine, so the rows upload asynchronously). `max_context` only names the limit
  // in errors.
  // `prefix_salt`: prefix caching on, with this salt (BlockHashSalt of the model and KV format);
  // nullopt: off.
  KvBlockAllocator(int64_t num_blocks, int block_size, int max_blocks_per_seq, int max_sequences, int64_t max_context,
                   std::span<int32_t> table, std::optional<uint64_t> prefix_salt = std::nullopt);

  // Promises sequence `id` (creating its state) the blocks `max_tokens` positions need, beyond
  // what it holds or was promised already (so calling it again with more grows the promise):
  // INVALID_ARGUMENT when the whole cache is too small, RESOURCE_EXHAUSTED when too few are free
  // now or every table row is taken. Nothing changes on an error.
  absl::Status Reserve(uint64_t id, int64_t max_tokens);
  // The sequence's state, created with a table row on first use (RESOURCE_EXHAUSTED when every
  // row is taken; nothing is left behind then).
  absl::StatusOr<Sequence*> Acquire(uint64_t id);
  // Null when the sequence holds nothing.
  Sequence* Find(uint64_t id);
  // Grows the sequence's blocks to hold `positions` positions, from its reservation first; growth
  // beyond it takes only blocks nobody was promised (RESOURCE_EXHAUSTED otherwise; OUT_OF_RANGE
  // past the table row's length). Blocks already taken stay taken on an error.
  absl::Status EnsurePositions(Sequence& s, int64_t positions);
  // Frees the sequence's blocks, reservation and table row; unknown ids are ignored. Its published
  // blocks that no other sequence uses stay cached (most recently used).
  void Release(uint64_t id);

  // Prefix caching: attaches to sequence `id` (created if new; it must hold no blocks yet) the
  // longest run of cached blocks that `tokens` begins with, leaving at least the last token to
  // compute, and returns the positions attached (whole blocks; 0 with caching off). The sequence's
  // `cached` becomes that; its later blocks are its own. RESOURCE_EXHAUSTED when no table row is free.
  absl::StatusOr<int64_t> AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens);
  // Publishes the sequence's full blocks within its first `computed` positions of `tokens`, so
  // later sequences with the same prefix share them. A block whose content another block already
  // holds stays private (freed on Release). Nothing with caching off.
  void PublishComputed(Sequence& s, std::span<const int32_t> tokens, int64_t computed);
  bool prefix_caching() const { return salt_.has_value(); }
  // With prefix caching: every block published or evicted, for the router (KvEventLog).
  const KvEventLog* events() const { return events_.get(); }
  // Blocks that nobody uses and that stay cached until evicted.
  int64_t cached_blocks() const { return static_cast<int64_t>(evictable_.size()); }
  int64_t evictions() const { return evictions_; }

  // Calls f(row) for each table row changed since the last call, and forgets them.
  template <typename F>
  void TakeDirtyRows(F&& f) {
    for (size_t r = 0; r < dirty_.size(); ++r) {
      if (dirty_[r]) dirty_[r] = 0, f(static_cast<int>(r));
    }
  }

  int trash_row() const { return max_sequences_; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }
  int block_size() const { return block_size_; }
  // Blocks that can ever be handed out (all but block 0).
  int64_t usable_blocks() const { return num_blocks_ - 1; }
  // Blocks neither taken nor promised (cached blocks nobody uses count: they are evicted for it).
  int64_t unpromised_blocks() const { return available() - reserved_; }
  size_t sequences() const { return seqs_.size(); }

 private:
  int64_t BlocksFor(int64_t positions) const { return (positions + block_size_ - 1) / block_size_; }
  int64_t available() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  // A block for a sequence: a free one, else the least recently used cached one (evicted).
  int32_t TakeBlock();
  void AppendBlock(Sequence& s, int32_t block);

  int64_t num_blocks_;
  int block_size_;
  int max_blocks_per_seq_;
  int max_sequences_;
  int64_t max_context_;
  std::span<int32_t> table_;
  std::vector<int32_t> free_;  // taken from the back: low block ids first
  int64_t reserved_ = 0;       // promised, not yet taken from free_
  std::vector<int> free_rows_;
  std::vector<char> dirty_;
  std::unordered_map<uint64_t, Sequence> seqs_;
  // Prefix caching.
  std::optional<uint64_t> salt_;
  std::vector<int32_t> refs_;                          // per block: sequences holding it
  std::vector<uint64_t> hash_;                         // per block: its published hash, 0 if none
  std::unordered_map<uint64_t, int32_t> by_hash_;      // published blocks
  std::list<int32_t> evictable_;                       // published, unused: least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;  // per block: its place in evictable_
  int64_t evictions_ = 0;
  std::unique_ptr<KvEventLog> events_;
};

}  // namespace tailserve
