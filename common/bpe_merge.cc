#include "common/bpe_merge.h"

#include <algorithm>

namespace tailserve::bpe_internal {
namespace {

// Orders the heap so the lowest rank, then the leftmost position, is on top (HF's order).
struct CandidateAfter {
  bool operator()(const MergeCandidate& a, const MergeCandidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

void MergeTable::Build(const std::vector<MergeRule>& rules) {
  size_t size = 2;
  shift_ = 63;
  while (size < 2 * rules.size()) {
    size *= 2;
    --shift_;
  }
  slots_.assign(size, Slot{});
  for (const MergeRule& rule : rules) {
    const uint64_t key = Key(rule.left, rule.right);
    size_t i = SlotIndex(key);
    while (slots_[i].key != Slot::kEmpty && slots_[i].key != key) i = (i + 1) & (size - 1);
    slots_[i] = Slot{key, Merge{rule.rank, rule.new_id}};
  }
}

const Merge* MergeTable::Find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  const uint64_t key = Key(left, right);
  for (size_t i = SlotIndex(key);; i = (i + 1) & (slots_.size() - 1)) {
    const Slot& slot = slots_[i];
    if (slot.key == key) return &slot.merge;
    if (slot.key == Slot::kEmpty) return nullptr;
  }
}

void MergeSymbols(const MergeTable& merges, MergeScratch& scratch, std::vector<int32_t>* ids) {
  std::vector<Symbol>& symbols = scratch.symbols;
  std::vector<MergeCandidate>& heap = scratch.heap;
  heap.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = merges.Find(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), CandidateAfter{});
  const auto push = [&](int32_t pos, const Merge* m) {
    heap.push_back({m->rank, pos, m->new_id});
    std::push_heap(heap.begin(), heap.end(), CandidateAfter{});
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandidateAfter{});
    const MergeCandidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = merges.Find(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // stale candidate
    left.id = top.new_id;
    left.next = right.next;
    right.alive = false;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = merges.Find(symbols[left.prev].id, left.id)) push(left.prev, m);
    }
    if (left.next >= 0) {
      if (const Merge* m = merges.Find(left.id, symbols[left.next].id)) push(top.pos, m);
    }
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

}  // namespace tailserve::bpe_internal
