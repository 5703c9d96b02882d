// The router's view of the workers' prefix caches (router/prefix_index.h): from its own
// placements (approximate) and from the workers' cache events (exact).
#include "router/prefix_index.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/block_hash.h"

namespace tailserve {
namespace {

const SteadyTime kT0{};

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

TEST(PrefixIndexTest, OverlapIsTheLeadingBlocksRoutedToEachWorker) {
  PrefixIndex index(3, 1000);
  const std::vector<int32_t> system = Tokens(40, 0);
  index.Record(1, PrefixIndex::Hash(system), kT0);  // two full blocks (32 tokens) and a partial one
  std::vector<int32_t> next = system;
  for (int32_t t : Tokens(30, 900)) next.push_back(t);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(next), kT0), (std::vector<int64_t>{0, 32, 0}));
  index.Record(2, PrefixIndex::Hash(next), kT0);  // 70 tokens: 4 full blocks
  std::vector<int32_t> third = next;
  third.push_back(5);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(third), kT0), (std::vector<int64_t>{0, 32, 64}));
  // The last token is always computed: an identical 64-token prompt matches 48.
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(std::vector<int32_t>(next.begin(), next.begin() + 64)), kT0),
            (std::vector<int64_t>{0, 32, 48}));
  // A different first token shares nothing, even with equal later blocks.
  std::vector<int32_t> other = next;
  other[0] = 777;
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(other), kT0), (std::vector<int64_t>{0, 0, 0}));
}

TEST(PrefixIndexTest, EachWorkerForgetsItsLeastRecentlyRoutedBlocksFirst) {
  PrefixIndex index(1, 4);
  const std::vector<int32_t> a = Tokens(33, 0), b = Tokens(33, 500), c = Tokens(33, 1000);
  index.Record(0, PrefixIndex::Hash(a), kT0);  // 2 blocks
  index.Record(0, PrefixIndex::Hash(b), kT0);  // 4 blocks: full
  index.Record(0, PrefixIndex::Hash(a), kT0);  // a is the most recent again
  index.Record(0, PrefixIndex::Hash(c), kT0);  // b's two blocks go
  EXPECT_EQ(index.blocks(0), 4u);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(a), kT0)[0], 32);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(b), kT0)[0], 0);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(c), kT0)[0], 32);
}

// A worker's chained block hashes under its salt, as its cache publishes them.
std::vector<uint64_t> WorkerHashes(uint64_t salt, const std::vector<int32_t>& tokens) {
  return ChainBlockHashes(salt, tokens, 16);
}

TEST(PrefixIndexTest, EventsGiveWhatTheWorkerHoldsEvictionsIncluded) {
  PrefixIndex index(2, 1000, std::chrono::seconds(2));
  const uint64_t salt = 0xabcdef;
  const std::vector<int32_t> doc = Tokens(65, 0);  // 4 full blocks
  const std::vector<uint64_t> h = WorkerHashes(salt, doc);
  // Worker 0 reports its cache; worker 1 sends no events (approximate, from placements).
  index.ApplyEvents(0, salt, /*snapshot=*/true, h, {});
  EXPECT_TRUE(index.exact(0));
  EXPECT_FALSE(index.exact(1));
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0), (std::vector<int64_t>{64, 0}));
  // It evicted its third block: the prefix it holds ends before it.
  index.ApplyEvents(0, salt, false, {}, std::vector<uint64_t>{h[2]});
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0)[0], 32);
  // ... and stored it again.
  index.ApplyEvents(0, salt, false, std::vector<uint64_t>{h[2]}, {});
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0)[0], 64);
  // A snapshot replaces everything.
  index.ApplyEvents(0, salt, true, std::vector<uint64_t>{h[0]}, {});
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0)[0], 16);
  // Another salt (another model or KV format) shares nothing.
  index.ApplyEvents(0, salt + 1, true, h, {});
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0)[0], 0);
  index.Forget(0);
  EXPECT_FALSE(index.exact(0));
}

// With events, the router's own placements count only until the worker's next events can show
// them: a prompt just routed is expected there, one routed long ago only if the events say so.
TEST(PrefixIndexTest, WithEventsAPlacementCountsForTheRecentWindowOnly) {
  PrefixIndex index(1, 1000, std::chrono::seconds(2));
  const uint64_t salt = 7;
  index.ApplyEvents(0, salt, true, {}, {});
  const std::vector<int32_t> doc = Tokens(33, 100);
  index.Record(0, PrefixIndex::Hash(doc), kT0);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0 + std::chrono::seconds(1))[0], 32);
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0 + std::chrono::seconds(3))[0], 0) << "evicted, as far as we know";
  index.ApplyEvents(0, salt, false, WorkerHashes(salt, doc), {});
  EXPECT_EQ(index.Overlap(PrefixIndex::Hash(doc), kT0 + std::chrono::seconds(3))[0], 32);
}

}  // namespace
}  // namespace tailserve
