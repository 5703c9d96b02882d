#include "worker/backends/cuda/plan/kv_block_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tailserve::cuda {

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int block_size, int max_blocks_per_seq, int max_sequences,
                                   int64_t max_context, std::span<int32_t> table)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      max_blocks_per_seq_(max_blocks_per_seq),
      max_sequences_(max_sequences),
      max_context_(max_context),
      table_(table) {
  for (int64_t i = num_blocks - 1; i >= 1; --i) free_.push_back(static_cast<int32_t>(i));
  for (int r = max_sequences - 1; r >= 0; --r) free_rows_.push_back(r);
  std::fill(table_.begin(), table_.end(), 0);
  dirty_.assign(static_cast<size_t>(max_sequences) + 1, 0);
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
  if (free_rows_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda: more than ", max_sequences_, " sequences hold KV cache at once"));
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

absl::Status KvBlockAllocator::EnsurePositions(Sequence& s, int64_t positions) {
  const int64_t need = BlocksFor(positions);
  if (need > max_blocks_per_seq_) {
    return absl::OutOfRangeError(absl::StrCat(positions, " tokens exceed the context of ", max_context_));
  }
  while (static_cast<int64_t>(s.blocks.size()) < need) {
    // Unreserved growth may only use what nobody was promised.
    if (free_.empty() || (s.reserved == 0 && static_cast<int64_t>(free_.size()) <= reserved_)) {
      return absl::ResourceExhaustedError("cuda: the KV cache is full");
    }
    const int32_t block = free_.back();
    free_.pop_back();
    if (s.reserved > 0) --s.reserved, --reserved_;  // the promise is now a block
    table_[static_cast<size_t>(s.table_row) * max_blocks_per_seq_ + s.blocks.size()] = block;
    s.blocks.push_back(block);
    dirty_[static_cast<size_t>(s.table_row)] = 1;
  }
  return absl::OkStatus();
}

void KvBlockAllocator::Release(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  reserved_ -= it->second.reserved;
  for (int32_t b : it->second.blocks) free_.push_back(b);
  if (it->second.table_row >= 0) free_rows_.push_back(it->second.table_row);
  seqs_.erase(it);
}

}  // namespace tailserve::cuda
