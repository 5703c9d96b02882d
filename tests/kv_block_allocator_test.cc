// The paged KV cache's block allocator (worker/kv/kv_block_allocator.h).
#include "worker/kv/kv_block_allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <string_view>
#include <vector>

#include "common/block_hash.h"

namespace tailserve {
namespace {


// 9 blocks of 4 positions (8 usable), 3 sequences of at most 5 blocks (20 positions).
struct Pool {
  std::vector<int32_t> table = std::vector<int32_t>(4 * 5, -1);
  KvBlockAllocator kv{9, 4, 5, 3, 20, table};
  std::vector<int> Dirty() {
    std::vector<int> rows;
    kv.TakeDirtyRows([&](int r) { rows.push_back(r); });
    return rows;
  }
};

TEST(KvBlockAllocatorTest, StartsEmptyWithTheTrashRowLast) {
  Pool p;
  EXPECT_EQ(p.kv.usable_blocks(), 8);
  EXPECT_EQ(p.kv.unpromised_blocks(), 8);
  EXPECT_EQ(p.kv.trash_row(), 3);
  EXPECT_EQ(p.table, std::vector<int32_t>(20, 0));  // zeroed: every row points at the trash block
  EXPECT_TRUE(p.Dirty().empty());
}

TEST(KvBlockAllocatorTest, GrowthFillsTheTableRowAndMarksItDirtyOnce) {
  Pool p;
  auto s = p.kv.Acquire(7);
  ASSERT_TRUE(s.ok()) << s.status();
  const int row = (*s)->table_row;
  ASSERT_TRUE(p.kv.EnsurePositions(**s, 9).ok());  // 3 blocks
  ASSERT_EQ((*s)->blocks.size(), 3u);
  std::set<int32_t> seen;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.table[row * 5 + i], (*s)->blocks[i]);
    EXPECT_NE((*s)->blocks[i], 0) << "block 0 is the trash block";
    seen.insert((*s)->blocks[i]);
  }
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(p.Dirty(), std::vector<int>{row});
  EXPECT_TRUE(p.Dirty().empty());
  ASSERT_TRUE(p.kv.EnsurePositions(**s, 12).ok());  // still 3 blocks: nothing changes
  EXPECT_TRUE(p.Dirty().empty());
  EXPECT_EQ(p.kv.unpromised_blocks(), 5);
}

TEST(KvBlockAllocatorTest, ReserveRefusesWhatCanNeverFitAndWhatDoesNotFitNow) {
  Pool p;
  const absl::Status too_big = p.kv.Reserve(1, 33);  // 9 blocks > 8
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument) << too_big;
  EXPECT_NE(too_big.message().find("lower max_tokens"), std::string::npos) << too_big;
  EXPECT_EQ(p.kv.sequences(), 0u);
  ASSERT_TRUE(p.kv.Reserve(1, 20).ok());  // 5 blocks promised
  EXPECT_EQ(p.kv.unpromised_blocks(), 3);
  const absl::Status full = p.kv.Reserve(2, 16);  // 4 > 3
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(p.kv.sequences(), 1u);  // nothing left behind
  EXPECT_EQ(p.kv.unpromised_blocks(), 3);
}

// The scheduler grows a promise step by step (KV on demand): Reserve again asks only for the
// blocks the sequence neither holds nor was promised.
TEST(KvBlockAllocatorTest, ReserveAgainGrowsThePromise) {
  Pool p;
  ASSERT_TRUE(p.kv.Reserve(1, 5).ok());  // 2 blocks
  EXPECT_EQ(p.kv.unpromised_blocks(), 6);
  ASSERT_TRUE(p.kv.Reserve(1, 8).ok());  // still 2: nothing more
  EXPECT_EQ(p.kv.unpromised_blocks(), 6);
  auto s = p.kv.Acquire(1);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(p.kv.EnsurePositions(**s, 8).ok());  // the promise becomes 2 blocks
  EXPECT_EQ((*s)->reserved, 0);
  ASSERT_TRUE(p.kv.Reserve(1, 13).ok());  // 4 blocks in all: 2 held, 2 more promised
  EXPECT_EQ((*s)->reserved, 2);
  EXPECT_EQ(p.kv.unpromised_blocks(), 4);
  ASSERT_TRUE(p.kv.Reserve(1, 4).ok());  // less than it holds: nothing changes
  EXPECT_EQ((*s)->reserved, 2);
  ASSERT_TRUE(p.kv.Reserve(2, 16).ok());  // 4 blocks: every block is spoken for
  EXPECT_EQ(p.kv.Reserve(1, 17).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*s)->reserved, 2) << "a refused growth promises nothing";
}

TEST(KvBlockAllocatorTest, UnreservedGrowthNeverTakesPromisedBlocks) {
  Pool p;
  ASSERT_TRUE(p.kv.Reserve(1, 24 - 4).ok());  // 5 of 8 promised
  auto other = p.kv.Acquire(2);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(p.kv.EnsurePositions(**other, 12).ok());  // the 3 unpromised blocks
  const absl::Status s = p.kv.EnsurePositions(**other, 13);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // The reserved sequence still gets all it was promised.
  auto owner = p.kv.Acquire(1);
  ASSERT_TRUE(owner.ok());
  ASSERT_TRUE(p.kv.EnsurePositions(**owner, 20).ok());
  EXPECT_EQ((*owner)->reserved, 0);
  EXPECT_EQ(p.kv.unpromised_blocks(), 0);
}

TEST(KvBlockAllocatorTest, ReleaseReturnsBlocksReservationAndRow) {
  Pool p;
  ASSERT_TRUE(p.kv.Reserve(1, 16).ok());
  auto s = p.kv.Acquire(1);
  ASSERT_TRUE(p.kv.EnsurePositions(**s, 5).ok());  // 2 of its 4 promised blocks taken
  EXPECT_EQ(p.kv.unpromised_blocks(), 4);
  p.kv.Release(1);
  EXPECT_EQ(p.kv.unpromised_blocks(), 8);
  EXPECT_EQ(p.kv.sequences(), 0u);
  EXPECT_EQ(p.kv.Find(1), nullptr);
  p.kv.Release(1);  // unknown ids are ignored
  EXPECT_EQ(p.kv.unpromised_blocks(), 8);
}

TEST(KvBlockAllocatorTest, TableRowsRunOutAndComeBack) {
  Pool p;
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(p.kv.Acquire(id).ok());
  std::set<int> rows;
  for (uint64_t id = 1; id <= 3; ++id) rows.insert(p.kv.Find(id)->table_row);
  EXPECT_EQ(rows, (std::set<int>{0, 1, 2}));
  const auto fourth = p.kv.Acquire(4);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(p.kv.Reserve(4, 4).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(p.kv.unpromised_blocks(), 8) << "a refused Reserve promises nothing";
  p.kv.Release(2);
  ASSERT_TRUE(p.kv.Acquire(4).ok());
  EXPECT_EQ(p.kv.Find(4)->table_row, 1);
}

TEST(KvBlockAllocatorTest, PositionsPastTheRowAreOutOfRange) {
  Pool p;
  auto s = p.kv.Acquire(1);
  const absl::Status st = p.kv.EnsurePositions(**s, 21);  // 6 blocks > 5 a row
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("context of 20"), std::string::npos) << st;
  EXPECT_TRUE((*s)->blocks.empty());
}

TEST(KvBlockAllocatorTest, ExhaustionKeepsWhatWasTaken) {
  Pool p;
  auto a = p.kv.Acquire(1);
  auto b = p.kv.Acquire(2);
  ASSERT_TRUE(p.kv.EnsurePositions(**a, 20).ok());  // 5 blocks
  const absl::Status st = p.kv.EnsurePositions(**b, 20);  // 3 left of the 5 it needs
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ((*b)->blocks.size(), 3u);
  EXPECT_EQ(p.kv.unpromised_blocks(), 0);
  p.kv.Release(1);
  ASSERT_TRUE(p.kv.EnsurePositions(**b, 20).ok());
}

}  // namespace
}  // namespace tailserve

namespace tailserve {
namespace {

// Prefix caching: 9 blocks of 4 positions (8 usable), sequences of up to 8 blocks, rows unlimited
// (no device table).
struct CachingPool {
  KvBlockAllocator kv{9, 4, 8, 3, 32, {}, BlockHashSalt(std::string_view("model|fp8"))};

  // A sequence that attaches what is cached, computes the rest and publishes it; returns the
  // positions it found cached.
  int64_t Run(uint64_t id, const std::vector<int32_t>& tokens) {
    absl::StatusOr<int64_t> hit = kv.AttachCachedPrefix(id, tokens);
    EXPECT_TRUE(hit.ok()) << hit.status();
    KvBlockAllocator::Sequence* s = kv.Find(id);
    EXPECT_TRUE(kv.EnsurePositions(*s, static_cast<int64_t>(tokens.size())).ok());
    kv.PublishComputed(*s, tokens, static_cast<int64_t>(tokens.size()));
    return hit.ok() ? *hit : -1;
  }
  std::vector<int32_t> Blocks(uint64_t id) { return kv.Find(id)->blocks; }
};

std::vector<int32_t> Tokens(std::initializer_list<int32_t> head, int total, int32_t fill) {
  std::vector<int32_t> t(head);
  while (static_cast<int>(t.size()) < total) t.push_back(fill + static_cast<int32_t>(t.size()));
  return t;
}

TEST(KvPrefixCacheTest, ASharedPrefixIsAttachedNotComputed) {
  struct Case {
    const char* name;
    std::vector<int32_t> second;  // the first sequence is 0..11 (three full blocks)
    int64_t attached;
  };
  const std::vector<int32_t> first = Tokens({}, 12, 0);
  const std::vector<Case> cases = {
      {"same two blocks, then different", Tokens({0, 1, 2, 3, 4, 5, 6, 7, 99}, 14, 50), 8},
      {"identical: the last token is always computed", first, 8},
      {"one more token: all three blocks", Tokens({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 13, 0), 12},
      {"first block differs: nothing, though block 2 is equal", Tokens({9, 1, 2, 3, 4, 5, 6, 7}, 12, 0), 0},
      {"shorter than a block", {0, 1, 2}, 0},
      {"empty", {}, 0},
  };
  for (const Case& c : cases) {
    CachingPool p;
    EXPECT_EQ(p.Run(1, first), 0) << c.name;
    EXPECT_EQ(p.Run(2, c.second), c.attached) << c.name;
    if (c.attached == 0) continue;
    const std::vector<int32_t> a = p.Blocks(1), b = p.Blocks(2);
    for (int64_t i = 0; i < c.attached / 4; ++i) EXPECT_EQ(a[i], b[i]) << c.name << ": block " << i << " shared";
    EXPECT_EQ(p.kv.Find(2)->cached, c.attached) << c.name;
  }
}

TEST(KvPrefixCacheTest, TheSaltSeparatesContextsAndTheChainCoversEveryEarlierToken) {
  const std::vector<int32_t> block = {1, 2, 3, 4};
  const uint64_t model_a = BlockHashSalt(std::string_view("a|fp8")), model_b = BlockHashSalt(std::string_view("a|fp16"));
  EXPECT_NE(model_a, model_b);
  EXPECT_NE(ChainBlockHash(model_a, block), ChainBlockHash(model_b, block));
  EXPECT_EQ(ChainBlockHash(model_a, block), ChainBlockHash(model_a, block));
  const std::vector<int32_t> before = {5, 6, 7, 8}, swapped = {1, 2, 4, 3};
  EXPECT_NE(ChainBlockHash(ChainBlockHash(model_a, before), block), ChainBlockHash(model_a, block));
  EXPECT_NE(ChainBlockHash(model_a, block), ChainBlockHash(model_a, swapped));
}

TEST(KvPrefixCacheTest, ReleasedBlocksStayCachedUntilEvictedTailFirst) {
  CachingPool p;
  const std::vector<int32_t> tokens = Tokens({}, 12, 0);
  p.Run(1, tokens);
  p.kv.Release(1);
  EXPECT_EQ(p.kv.cached_blocks(), 3);
  EXPECT_EQ(p.kv.unpromised_blocks(), 8) << "cached blocks nobody uses can be taken";
  // Another sequence needs 6 blocks: the 5 free ones, then the cached tail block is evicted.
  auto other = p.kv.AttachCachedPrefix(2, Tokens({100}, 24, 100));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, 0);
  ASSERT_TRUE(p.kv.EnsurePositions(*p.kv.Find(2), 24).ok());
  EXPECT_EQ(p.kv.evictions(), 1);
  EXPECT_EQ(p.kv.cached_blocks(), 2);
  p.kv.Release(2);
  EXPECT_EQ(p.Run(3, tokens), 8) << "the first two blocks are still cached";
}

TEST(KvPrefixCacheTest, BlocksInUseAreNeverEvicted) {
  CachingPool p;
  p.Run(1, Tokens({}, 20, 0));  // 5 blocks, held
  auto other = p.kv.AttachCachedPrefix(2, Tokens({100}, 16, 100));
  ASSERT_TRUE(other.ok());
  const absl::Status full = p.kv.EnsurePositions(*p.kv.Find(2), 16);  // 4 blocks, 3 free
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(p.kv.evictions(), 0);
  p.kv.Release(2);
  EXPECT_EQ(p.Run(3, Tokens({}, 20, 0)), 16) << "the running sequence's blocks are intact and shared";
}

TEST(KvPrefixCacheTest, AttachingTakesCachedBlocksOffTheEvictionList) {
  CachingPool p;
  p.Run(1, Tokens({}, 12, 0));
  p.kv.Release(1);
  EXPECT_EQ(p.Run(2, Tokens({}, 13, 0)), 12);
  EXPECT_EQ(p.kv.cached_blocks(), 0);
  // Shared blocks stay while any holder runs.
  EXPECT_EQ(p.Run(3, Tokens({}, 9, 0)), 8);
  p.kv.Release(2);
  EXPECT_EQ(p.kv.cached_blocks(), 1) << "block 2 is unused; blocks 0 and 1 are held by sequence 3";
  p.kv.Release(3);
  EXPECT_EQ(p.kv.cached_blocks(), 3);
  EXPECT_EQ(p.kv.unpromised_blocks(), 8);
}

TEST(KvPrefixCacheTest, ContentComputedTwiceIsCachedOnce) {
  CachingPool p;
  const std::vector<int32_t> tokens = Tokens({}, 8, 0);
  // Both start before either has published: each computes its own copy.
  ASSERT_EQ(*p.kv.AttachCachedPrefix(1, tokens), 0);
  ASSERT_EQ(*p.kv.AttachCachedPrefix(2, tokens), 0);
  for (uint64_t id : {1, 2}) {
    ASSERT_TRUE(p.kv.EnsurePositions(*p.kv.Find(id), 8).ok());
    p.kv.PublishComputed(*p.kv.Find(id), tokens, 8);
  }
  p.kv.Release(2);
  EXPECT_EQ(p.kv.cached_blocks(), 0) << "the second copy was never published: freed";
  p.kv.Release(1);
  EXPECT_EQ(p.kv.cached_blocks(), 2);
}

TEST(KvPrefixCacheTest, PublishingFollowsTheComputedPositionsOnly) {
  CachingPool p;
  const std::vector<int32_t> tokens = Tokens({}, 16, 0);
  ASSERT_EQ(*p.kv.AttachCachedPrefix(1, tokens), 0);
  KvBlockAllocator::Sequence* s = p.kv.Find(1);
  ASSERT_TRUE(p.kv.EnsurePositions(*s, 16).ok());
  p.kv.PublishComputed(*s, tokens, 6);  // a prefill chunk of 6: one full block
  EXPECT_EQ(s->hashed, 1);
  EXPECT_EQ(p.Run(2, tokens), 4);
  p.kv.PublishComputed(*s, tokens, 16);
  EXPECT_EQ(p.Run(3, tokens), 12);
}

TEST(KvPrefixCacheTest, OffAttachesNothingAndFreesEverything) {
  std::vector<int32_t> table(4 * 5);
  KvBlockAllocator kv{9, 4, 5, 3, 20, table};
  const std::vector<int32_t> tokens = Tokens({}, 12, 0);
  for (uint64_t id : {1, 2}) {
    auto hit = kv.AttachCachedPrefix(id, tokens);
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(*hit, 0);
    ASSERT_TRUE(kv.EnsurePositions(*kv.Find(id), 12).ok());
    kv.PublishComputed(*kv.Find(id), tokens, 12);
  }
  kv.Release(1);
  kv.Release(2);
  EXPECT_EQ(kv.cached_blocks(), 0);
  EXPECT_EQ(kv.unpromised_blocks(), 8);
  EXPECT_FALSE(kv.prefix_caching());
}

}  // namespace
}  // namespace tailserve

namespace tailserve {
namespace {

// The cache's event stream follows what it publishes and evicts; a reader that follows gets each
// hash's last state since its cursor, one that fell behind (or is new) a snapshot.
TEST(KvEventLogTest, FollowsPublishAndEvictionAndSnapshotsForNewReaders) {
  CachingPool p;
  const KvEventLog* log = p.kv.events();
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->block_size(), 4);
  const std::vector<int32_t> tokens = Tokens({}, 12, 0);
  KvEventLog::Changes first = log->Since(0);
  EXPECT_TRUE(first.snapshot);
  EXPECT_TRUE(first.stored.empty());
  p.Run(1, tokens);  // publishes 3 blocks
  KvEventLog::Changes c = log->Since(first.next);
  EXPECT_FALSE(c.snapshot);
  EXPECT_EQ(c.stored.size(), 3u);
  EXPECT_TRUE(c.removed.empty());
  // Evict the tail block (as in ReleasedBlocksStayCachedUntilEvictedTailFirst).
  p.kv.Release(1);
  ASSERT_TRUE(p.kv.AttachCachedPrefix(2, Tokens({100}, 24, 100)).ok());
  ASSERT_TRUE(p.kv.EnsurePositions(*p.kv.Find(2), 24).ok());
  KvEventLog::Changes after = log->Since(c.next);
  ASSERT_EQ(after.removed.size(), 1u);
  EXPECT_EQ(std::count(c.stored.begin(), c.stored.end(), after.removed[0]), 1) << "one of the published";
  // From the start: stored then removed in one window leaves only the removal of that hash.
  KvEventLog::Changes all = log->Since(first.next);
  EXPECT_EQ(all.stored.size(), 2u);
  EXPECT_EQ(all.removed.size(), 1u);
  // A snapshot is what is cached now.
  EXPECT_EQ(log->Since(0).stored.size(), 2u);
  EXPECT_TRUE(log->Since(all.next + 5).snapshot) << "a cursor from the future (another log)";
}

TEST(KvEventLogTest, AReaderBehindTheRetainedWindowGetsASnapshot) {
  KvEventLog log(1, 16, /*capacity=*/4);
  const uint64_t start = log.Since(0).next;
  for (uint64_t h = 10; h < 16; ++h) log.Stored(h);  // 6 events, 4 retained
  log.Removed(10);
  EXPECT_TRUE(log.Since(start).snapshot);
  EXPECT_EQ(log.Since(start).stored.size(), 5u);
  EXPECT_EQ(log.cached(), 5u);
  const KvEventLog::Changes recent = log.Since(log.Since(0).next - 2);
  EXPECT_FALSE(recent.snapshot);
  EXPECT_EQ(recent.stored, std::vector<uint64_t>{15});
  EXPECT_EQ(recent.removed, std::vector<uint64_t>{10});
  EXPECT_NE(log.epoch(), KvEventLog(1, 16).epoch());
}

}  // namespace
}  // namespace tailserve
