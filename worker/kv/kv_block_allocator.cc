#include "worker/kv/kv_block_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"

namespace tailserve {

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int block_size, int max_blocks_per_seq, int max_sequences,
                                   int64_t max_context, std::span<int32_t> table, std::optional<uint64_t> prefix_salt)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      max_blocks_per_seq_(max_blocks_per_seq),
      max_sequences_(max_sequences),
      max_context_(max_context),
      table_(table),
      salt_(prefix_salt) {
  for (int64_t i = num_blocks - 1; i >= 1; --i) free_.push_back(static_cast<int32_t>(i));
  if (!table_.empty()) {
    for (int r = max_sequences - 1; r >= 0; --r) free_rows_.push_back(r);
    std::fill(table_.begin(), table_.end(), 0);
    dirty_.assign(static_cast<size_t>(max_sequences) + 1, 0);
  }
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  if (salt_) {
    hash_.assign(static_cast<size_t>(num_blocks), 0);
    lru_pos_.resize(static_cast<size_t>(num_blocks));
    events_ = std::make_unique<KvEventLog>(*salt_, block_size_);
  }
}

absl::Status KvBlockAllocator::Reserve(uint64_t id, int64_t max_tokens) {
  const int64_t need = BlocksFor(max_tokens);
  if (need > usable_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: ", max_tokens, " tokens need ", need,
                                                   " blocks, more than the whole cache holds (", usable_blocks(),
                                                   "); lower max_tokens"));
  }
  // Growing a sequence's promise asks only for the blocks it neither holds nor was promised.
  const Sequence* known = Find(id);
  const int64_t extra =
      known == nullptr ? need : need - static_cast<int64_t>(known->blocks.size()) - known->reserved;
  if (extra <= 0) return absl::OkStatus();
  if (extra > unpromised_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", extra, " blocks needed, ", unpromised_blocks(), " free"));
  }
  absl::StatusOr<Sequence*> s = Acquire(id);
  if (!s.ok()) return s.status();
  (*s)->reserved += extra;
  reserved_ += extra;
  return absl::OkStatus();
}

absl::StatusOr<KvBlockAllocator::Sequence*> KvBlockAllocator::Acquire(uint64_t id) {
  if (auto it = seqs_.find(id); it != seqs_.end()) return &it->second;
  if (table_.empty()) return &seqs_[id];
  if (free_rows_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: more than ", max_sequences_, " sequences hold KV cache at once"));
  }
  Sequence& s = seqs_[id];
  s.table_row = free_rows_.back();
  free_rows_.pop_back();
  return &s;
}

KvBlockAllocator::Sequence* KvBlockAllocator::Find(uint64_t id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

int32_t KvBlockAllocator::TakeBlock() {
  if (!free_.empty()) {
    const int32_t block = free_.back();
    free_.pop_back();
    return block;
  }
  const int32_t block = evictable_.front();  // the caller checked available()
  evictable_.pop_front();
  by_hash_.erase(hash_[static_cast<size_t>(block)]);
  if (events_) events_->Removed(hash_[static_cast<size_t>(block)]);
  hash_[static_cast<size_t>(block)] = 0;
  ++evictions_;
  return block;
}

void KvBlockAllocator::AppendBlock(Sequence& s, int32_t block) {
  ++refs_[static_cast<size_t>(block)];
  if (!table_.empty()) {
    table_[static_cast<size_t>(s.table_row) * max_blocks_per_seq_ + s.blocks.size()] = block;
    dirty_[static_cast<size_t>(s.table_row)] = 1;
  }
  s.blocks.push_back(block);
}

absl::Status KvBlockAllocator::EnsurePositions(Sequence& s, int64_t positions) {
  const int64_t need = BlocksFor(positions);
  if (need > max_blocks_per_seq_) {
    return absl::OutOfRangeError(absl::StrCat(positions, " tokens exceed the context of ", max_context_));
  }
  while (static_cast<int64_t>(s.blocks.size()) < need) {
    // Unreserved growth may only use what nobody was promised.
    if (available() == 0 || (s.reserved == 0 && available() <= reserved_)) {
      return absl::ResourceExhaustedError("KV cache: full");
    }
    if (s.reserved > 0) --s.reserved, --reserved_;  // the promise is now a block
    AppendBlock(s, TakeBlock());
  }
  return absl::OkStatus();
}

void KvBlockAllocator::Release(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  reserved_ -= it->second.reserved;
  // Tail blocks first: they are evicted first, which keeps the longest prefix cached (as vLLM).
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto r = blocks.rbegin(); r != blocks.rend(); ++r) {
    const int32_t b = *r;
    if (--refs_[static_cast<size_t>(b)] > 0) continue;  // shared: another sequence still reads it
    if (salt_ && hash_[static_cast<size_t>(b)] != 0) {
      lru_pos_[static_cast<size_t>(b)] = evictable_.insert(evictable_.end(), b);
    } else {
      free_.push_back(b);
    }
  }
  if (it->second.table_row >= 0) free_rows_.push_back(it->second.table_row);
  seqs_.erase(it);
}

absl::StatusOr<int64_t> KvBlockAllocator::AttachCachedPrefix(uint64_t id, std::span<const int32_t> tokens) {
  absl::StatusOr<Sequence*> acquired = Acquire(id);
  if (!acquired.ok()) return acquired.status();
  Sequence& s = **acquired;
  if (!salt_ || !s.blocks.empty() || tokens.empty()) return 0;
  // At least the last token is computed: its logits are the step's output.
  const int64_t most = std::min<int64_t>((static_cast<int64_t>(tokens.size()) - 1) / block_size_, max_blocks_per_seq_);
  uint64_t h = *salt_;
  for (int64_t b = 0; b < most; ++b) {
    h = ChainBlockHash(h, tokens.subspan(static_cast<size_t>(b * block_size_), static_cast<size_t>(block_size_)));
    const auto found = by_hash_.find(h);
    if (found == by_hash_.end()) break;
    const int32_t block = found->second;
    if (refs_[static_cast<size_t>(block)] == 0) evictable_.erase(lru_pos_[static_cast<size_t>(block)]);
    AppendBlock(s, block);
    s.hashed = b + 1;
    s.last_hash = h;
  }
  s.cached = static_cast<int64_t>(s.blocks.size()) * block_size_;
  return s.cached;
}

void KvBlockAllocator::PublishComputed(Sequence& s, std::span<const int32_t> tokens, int64_t computed) {
  if (!salt_) return;
  const int64_t full = std::min<int64_t>(std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) / block_size_,
                                         static_cast<int64_t>(s.blocks.size()));
  for (int64_t b = s.hashed; b < full; ++b) {
    const uint64_t h = ChainBlockHash(s.hashed == 0 ? *salt_ : s.last_hash,
                                      tokens.subspan(static_cast<size_t>(b * block_size_), static_cast<size_t>(block_size_)));
    const int32_t block = s.blocks[static_cast<size_t>(b)];
    if (by_hash_.emplace(h, block).second) {
      hash_[static_cast<size_t>(block)] = h;
      events_->Stored(h);
    }
    s.hashed = b + 1;
    s.last_hash = h;
  }
}

}  // namespace tailserve
