// The router's approximate view of the workers' prefix caches (router/prefix_index.h).
#include "router/prefix_index.h"

#include <gtest/gtest.h>

#include <vector>

namespace tailserve {
namespace {

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

TEST(PrefixIndexTest, OverlapIsTheLeadingBlocksRoutedToEachWorker) {
  PrefixIndex index(3, 1000);
  const std::vector<int32_t> system = Tokens(40, 0);
  index.Record(1, PrefixIndex::Hash(system));  // two full blocks (32 tokens) and a partial one
  std::vector<int32_t> next = system;
  for (int32_t t : Tokens(30, 900)) next.push_back(t);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(next)), (std::vector<int64_t>{0, 32, 0}));
  index.Record(2, PrefixIndex::Hash(next));  // 70 tokens: 4 full blocks
  std::vector<int32_t> third = next;
  third.push_back(5);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(third)), (std::vector<int64_t>{0, 32, 64}));
  // The last token is always computed: an identical 64-token prompt matches 48.
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(std::vector<int32_t>(next.begin(), next.begin() + 64))),
            (std::vector<int64_t>{0, 32, 48}));
  // A different first token shares nothing, even with equal later blocks.
  std::vector<int32_t> other = next;
  other[0] = 777;
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(other)), (std::vector<int64_t>{0, 0, 0}));
}

TEST(PrefixIndexTest, EachWorkerForgetsItsLeastRecentlyRoutedBlocksFirst) {
  PrefixIndex index(1, 4);
  const std::vector<int32_t> a = Tokens(33, 0), b = Tokens(33, 500), c = Tokens(33, 1000);
  index.Record(0, PrefixIndex::Hash(a));  // 2 blocks
  index.Record(0, PrefixIndex::Hash(b));  // 4 blocks: full
  index.Record(0, PrefixIndex::Hash(a));  // a is the most recent again
  index.Record(0, PrefixIndex::Hash(c));  // b's two blocks go
  EXPECT_EQ(index.blocks(0), 4u);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(a))[0], 32);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(b))[0], 0);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(c))[0], 32);
}

}  // namespace
}  // namespace tailserve
