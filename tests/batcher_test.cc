// The batchers with an injected clock: which requests form which batch, and when.
#include "router/batcher.h"

#include <gtest/gtest.h>

namespace tailserve {
namespace {

using Ids = std::vector<uint64_t>;

class BatcherTest : public ::testing::Test {
 protected:
  BatcherTest() {
    batching_.max_batch_size = 4;
    batching_.min_batch_size = 2;
    batching_.variance_tolerance = 0.1;
    router_.timeout_ms = 200;
    router_.max_wait_ms = 1000;
  }
  std::unique_ptr<LadbBatcher> Make(const std::string& mode) {
    batching_.mode = mode;
    return std::make_unique<LadbBatcher>(batching_, router_);
  }
  QueuedRequest Req(uint64_t id, double steps, v1::Priority p = v1::PRIORITY_STANDARD) {
    return {id, p, steps, clock_.Now()};
  }
  void Wait(int ms) { clock_.Advance(std::chrono::milliseconds(ms)); }
  BatchingConfig batching_;
  RouterConfig router_;
  FakeClock clock_;
  BatchReason reason_;
};

// ---- FCFS (batching.mode: fcfs, the honest baseline) ----

TEST_F(BatcherTest, FcfsDispatchesEachRequestAtOnceAloneInArrivalOrder) {
  FcfsBatcher b;
  EXPECT_TRUE(b.Next(clock_.Now(), 100, &reason_).empty());
  b.Push(Req(1, 500), false);
  b.Push(Req(2, 5, v1::PRIORITY_INTERACTIVE), false);  // neither prediction nor class reorders
  b.Push(Req(3, 50), true);                            // handed back: first
  EXPECT_FALSE(b.NextDeadline().has_value());          // nothing ever waits
  EXPECT_TRUE(b.Next(clock_.Now(), 0, &reason_).empty());
  EXPECT_EQ(b.Next(clock_.Now(), 100, &reason_), Ids{3});
  EXPECT_EQ(reason_, BatchReason::kImmediate);
  EXPECT_TRUE(b.Remove(2));
  EXPECT_FALSE(b.Remove(2));
  EXPECT_EQ(b.Next(clock_.Now(), 100, &reason_), Ids{1});
  EXPECT_EQ(b.size(), 0u);
  b.SetLengthAware(true);
  EXPECT_FALSE(b.length_aware());
}

TEST_F(BatcherTest, ModeChoosesTheBatcher) {
  batching_.mode = "fcfs";
  EXPECT_NE(dynamic_cast<FcfsBatcher*>(MakeBatcher(batching_, router_).get()), nullptr);
  batching_.mode = "ladb";
  EXPECT_NE(dynamic_cast<LadbBatcher*>(MakeBatcher(batching_, router_).get()), nullptr);
}

// ---- FIFO (batching.mode: fifo, or the drift fallback) ----

TEST_F(BatcherTest, FifoWaitsForMinSizeOrTimeout) {
  auto b = Make("fifo");
  b->Push(Req(1, 10), false);
  EXPECT_TRUE(b->Next(clock_.Now(), 100, &reason_).empty());
  EXPECT_EQ(*b->NextDeadline(), clock_.Now() + std::chrono::milliseconds(200));
  Wait(199);
  EXPECT_TRUE(b->Next(clock_.Now(), 100, &reason_).empty());
  Wait(1);
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), Ids{1});
  EXPECT_EQ(reason_, BatchReason::kTimeout);
  EXPECT_FALSE(b->NextDeadline().has_value());
}

TEST_F(BatcherTest, FifoIgnoresPredictionsAndPriority) {
  auto b = Make("fifo");
  b->Push(Req(1, 500), false);
  b->Push(Req(2, 5, v1::PRIORITY_INTERACTIVE), false);
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), (Ids{1, 2}));
  EXPECT_EQ(reason_, BatchReason::kMinSize);
  for (uint64_t i = 3; i <= 8; ++i) b->Push(Req(i, 10 * i), false);
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), (Ids{3, 4, 5, 6}));
  EXPECT_EQ(reason_, BatchReason::kFull);
  EXPECT_EQ(b->Next(clock_.Now(), 1, &reason_), (Ids{7}));  // capacity caps the batch
  EXPECT_TRUE(b->Next(clock_.Now(), 0, &reason_).empty());
}

TEST_F(BatcherTest, RequeuedGoFirstAndRemoveWorks) {
  auto b = Make("fifo");
  b->Push(Req(1, 10), false);
  b->Push(Req(2, 10), false);
  b->Push(Req(3, 10), false);
  EXPECT_TRUE(b->Remove(2));
  EXPECT_FALSE(b->Remove(2));
  b->Push(Req(9, 10), true);
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), (Ids{9, 1, 3}));
}

// ---- LADB ----

TEST_F(BatcherTest, GroupsOnlyPredictionsWithinTolerance) {
  auto b = Make("ladb");
  b->Push(Req(1, 100), false);
  b->Push(Req(2, 500), false);
  EXPECT_TRUE(b->Next(clock_.Now(), 100, &reason_).empty());  // two requests, but not alike
  b->Push(Req(3, 108), false);                                 // within 10% of 100
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), (Ids{1, 3}));
  EXPECT_EQ(reason_, BatchReason::kMinSize);
  EXPECT_EQ(b->size(), 1u);
}

struct GroupCase {
  std::string name;
  std::vector<double> steps;  // ids 1..n, all arriving now
  int wait_ms;
  Ids expected;
  BatchReason reason;
};

class LadbTable : public BatcherTest, public ::testing::WithParamInterface<GroupCase> {};

TEST_P(LadbTable, FormsTheExpectedBatch) {
  const GroupCase& c = GetParam();
  auto b = Make("ladb");
  for (size_t i = 0; i < c.steps.size(); ++i) b->Push(Req(i + 1, c.steps[i]), false);
  Wait(c.wait_ms);
  const Ids got = b->Next(clock_.Now(), 100, &reason_);
  EXPECT_EQ(got, c.expected);
  if (!c.expected.empty()) {
    EXPECT_EQ(reason_, c.reason);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LadbTable,
    ::testing::Values(
        // Shortest first: the 10-step group is tried before the 50-step one.
        GroupCase{"short_group_first", {50, 10, 52, 11}, 0, {2, 4}, BatchReason::kMinSize},
        // Full: four alike requests leave at once, the odd one stays.
        GroupCase{"full", {20, 20.5, 19.5, 20, 90}, 0, {3, 1, 4, 2}, BatchReason::kFull},
        // Within +-10% of the anchor (19): 21 is outside, so only three go.
        GroupCase{"tolerance_edge", {20, 21, 19, 20}, 0, {3, 1, 4}, BatchReason::kMinSize},
        // Nothing alike and no timeout yet: everyone waits.
        GroupCase{"none_alike", {10, 40, 160}, 150, {}, BatchReason::kTimeout},
        // At timeout the most urgent (shortest) goes alone: immediate_dispatch.
        GroupCase{"timeout_alone", {10, 40, 160}, 200, {1}, BatchReason::kTimeout},
        // Zero-width tolerance edge: equal predictions still group.
        GroupCase{"equal", {7, 7}, 0, {1, 2}, BatchReason::kMinSize}),
    [](const auto& info) { return info.param.name; });

TEST_F(BatcherTest, InteractiveBeforeStandardBeforeBatch) {
  auto b = Make("ladb");
  b->Push(Req(1, 10, v1::PRIORITY_BATCH), false);
  b->Push(Req(2, 300, v1::PRIORITY_STANDARD), false);
  b->Push(Req(3, 900, v1::PRIORITY_INTERACTIVE), false);
  Wait(200);
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), Ids{3});
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), Ids{2});
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), Ids{1});
}

TEST_F(BatcherTest, BoundedWaitPreventsStarvation) {
  batching_.min_batch_size = 1;  // every request is ready at once: only ordering decides
  auto b = Make("ladb");
  b->Push(Req(1, 800, v1::PRIORITY_BATCH), false);  // long, low class
  // A stream of short interactive requests keeps arriving while capacity is one at a time.
  uint64_t next = 100;
  Ids order;
  for (int t = 0; t < 12; ++t) {
    b->Push(Req(next++, 5, v1::PRIORITY_INTERACTIVE), false);
    b->Push(Req(next++, 5, v1::PRIORITY_INTERACTIVE), false);  // more arrive than leave
    Wait(100);
    const Ids got = b->Next(clock_.Now(), 1, &reason_);
    order.insert(order.end(), got.begin(), got.end());
  }
  const auto at = std::find(order.begin(), order.end(), 1u);
  ASSERT_NE(at, order.end()) << "the long batch-class request starved";
  // It went once it had waited max_wait_ms (1000 ms), not before.
  EXPECT_EQ(at - order.begin(), 9);
}

TEST_F(BatcherTest, RequeuedLongWorkGroupsWithLongWork) {
  auto b = Make("ladb");
  b->Push(Req(1, 10), false);
  b->Push(Req(2, 400), false);
  Wait(50);
  b->Push({7, v1::PRIORITY_STANDARD, 410, clock_.Now() - std::chrono::milliseconds(60)}, true);  // overran its budget
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), (Ids{2, 7}));  // not with the 10-step request
}

TEST_F(BatcherTest, LatencyAwareWaitSpendsOnlyTheTargetsSlack) {
  batching_.target_latency_ms = 350;
  auto b = Make("ladb");
  b->SetStepSeconds(0.005);                 // 5 ms per decode step
  b->Push(Req(1, 100), false);              // needs 500 ms > target: no slack, goes at once
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), Ids{1});
  EXPECT_EQ(reason_, BatchReason::kTimeout);
  b->Push(Req(2, 40), false);               // 200 ms of work: 150 ms of slack
  EXPECT_NEAR(Seconds(*b->NextDeadline() - clock_.Now()), 0.150, 1e-6);
  Wait(149);
  EXPECT_TRUE(b->Next(clock_.Now(), 100, &reason_).empty());
  Wait(1);
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), Ids{2});
  b->Push(Req(3, 2), false);                // plenty of slack: capped at timeout_ms
  EXPECT_EQ(*b->NextDeadline(), clock_.Now() + std::chrono::milliseconds(200));
  b->SetStepSeconds(0);                     // step time unknown: the plain timeout
  b->Push(Req(4, 1000), false);
  EXPECT_EQ(*b->NextDeadline(), clock_.Now() + std::chrono::milliseconds(200));
}

TEST_F(BatcherTest, SwitchingToFifoKeepsTheQueue) {
  auto b = Make("ladb");
  b->Push(Req(1, 10), false);
  b->Push(Req(2, 900), false);
  EXPECT_TRUE(b->Next(clock_.Now(), 100, &reason_).empty());
  b->SetLengthAware(false);
  EXPECT_FALSE(b->length_aware());
  EXPECT_EQ(b->Next(clock_.Now(), 100, &reason_), (Ids{1, 2}));
}

}  // namespace
}  // namespace tailserve
