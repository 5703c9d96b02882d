#pragma once
// BPE merging of one word, as HF's Word::merge_all: the word starts as one symbol per byte, and
// the adjacent pair with the lowest merge rank (then the leftmost) is merged until no pair has a
// merge rule.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tailserve::bpe_internal {

// A merge rule: the symbols `left` `right` side by side become `new_id`; lower ranks go first.
struct MergeRule {
  int32_t left;
  int32_t right;
  int32_t rank;
  int32_t new_id;
};

struct Merge {
  int32_t rank;
  int32_t new_id;
};

// Open-addressing (linear probing) table of merges keyed by the (left, right) pair: the hot
// lookup of encoding, kept flat for cache locality.
class MergeTable {
 public:
  // A repeated pair takes its later rank, as HF's map insertion does.
  void Build(const std::vector<MergeRule>& rules);
  // The merge of `left` followed by `right`, or null.
  const Merge* Find(int32_t left, int32_t right) const;

 private:
  struct Slot {
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    uint64_t key = kEmpty;
    Merge merge{};
  };

  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  size_t SlotIndex(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);  // Fibonacci hash
  }

  std::vector<Slot> slots_;  // size a power of two, at most half full
  int shift_ = 64;           // 64 - log2(slots_.size())
};

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  bool alive;
};

// A candidate merge of the symbol at `pos` with its right neighbour.
struct MergeCandidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};

// Per-call buffers of merging, so that encoding stays const and thread-safe.
struct MergeScratch {
  std::vector<Symbol> symbols;  // the word; merged symbols stay in place, no longer alive
  std::vector<MergeCandidate> heap;
};

// Appends `id` as the last symbol of the word in scratch.symbols (which the caller clears first).
inline void AppendSymbol(int32_t id, MergeScratch& scratch) {
  std::vector<Symbol>& symbols = scratch.symbols;
  const auto index = static_cast<int32_t>(symbols.size());
  if (index > 0) symbols.back().next = index;
  symbols.push_back(Symbol{id, index - 1, -1, true});
}

// Merges the word in scratch.symbols and appends the ids of the resulting symbols to `ids`.
// Uses a heap of candidates that are checked for staleness when popped: O(n log n).
void MergeSymbols(const MergeTable& merges, MergeScratch& scratch, std::vector<int32_t>* ids);

}  // namespace tailserve::bpe_internal
