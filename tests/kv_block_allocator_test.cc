// The CUDA backend's KV block allocator (plan/kv_block_allocator.h): plain C++, checked without a GPU.
#include "worker/backends/cuda/plan/kv_block_allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace tailserve {
namespace {

using cuda::KvBlockAllocator;

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
