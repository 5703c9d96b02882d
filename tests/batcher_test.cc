#include "router/batcher.h"

#include <gtest/gtest.h>

namespace tailserve {
namespace {

class FifoBatcherTest : public ::testing::Test {
 protected:
  FifoBatcherTest() {
    batching_.max_batch_size = 4;
    batching_.min_batch_size = 2;
    router_.timeout_ms = 200;
  }
  QueuedRequest At(uint64_t id) { return {id, v1::PRIORITY_STANDARD, 10, clock_.Now()}; }
  BatchingConfig batching_;
  RouterConfig router_;
  FakeClock clock_;
};

TEST_F(FifoBatcherTest, WaitsForMinSizeOrTimeout) {
  FifoBatcher b(batching_, router_);
  BatchReason reason;
  b.Push(At(1), false);
  EXPECT_TRUE(b.Next(clock_.Now(), 100, &reason).empty());
  ASSERT_TRUE(b.NextDeadline().has_value());
  EXPECT_EQ(*b.NextDeadline(), clock_.Now() + std::chrono::milliseconds(200));
  clock_.Advance(std::chrono::milliseconds(199));
  EXPECT_TRUE(b.Next(clock_.Now(), 100, &reason).empty());
  clock_.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(b.Next(clock_.Now(), 100, &reason), std::vector<uint64_t>{1});
  EXPECT_EQ(reason, BatchReason::kTimeout);
  EXPECT_FALSE(b.NextDeadline().has_value());
}

TEST_F(FifoBatcherTest, MinSizeAndFullInArrivalOrder) {
  FifoBatcher b(batching_, router_);
  BatchReason reason;
  b.Push(At(1), false);
  b.Push(At(2), false);
  EXPECT_EQ(b.Next(clock_.Now(), 100, &reason), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(reason, BatchReason::kMinSize);
  for (uint64_t i = 3; i <= 8; ++i) b.Push(At(i), false);
  EXPECT_EQ(b.Next(clock_.Now(), 100, &reason), (std::vector<uint64_t>{3, 4, 5, 6}));
  EXPECT_EQ(reason, BatchReason::kFull);
  EXPECT_EQ(b.size(), 2u);
}

TEST_F(FifoBatcherTest, CapacityCapsTheBatch) {
  FifoBatcher b(batching_, router_);
  BatchReason reason;
  for (uint64_t i = 1; i <= 4; ++i) b.Push(At(i), false);
  EXPECT_TRUE(b.Next(clock_.Now(), 0, &reason).empty());
  EXPECT_EQ(b.Next(clock_.Now(), 3, &reason), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(b.size(), 1u);
}

TEST_F(FifoBatcherTest, RequeuedGoFirstAndRemoveWorks) {
  FifoBatcher b(batching_, router_);
  BatchReason reason;
  b.Push(At(1), false);
  b.Push(At(2), false);
  b.Push(At(3), false);
  EXPECT_TRUE(b.Remove(2));
  EXPECT_FALSE(b.Remove(2));
  b.Push(At(9), true);
  EXPECT_EQ(b.Next(clock_.Now(), 100, &reason), (std::vector<uint64_t>{9, 1, 3}));
}

}  // namespace
}  // namespace tailserve
