#include "router/worker_pool.h"

#include <gtest/gtest.h>

namespace tailserve {
namespace {

v1::WorkerStatus Ready(int slots, int running = 0) {
  v1::WorkerStatus s;
  s.set_ready(true);
  s.set_total_slots(slots);
  s.set_running_sequences(running);
  return s;
}

TEST(WorkerPoolTest, UnhealthyUntilFirstGoodStatus) {
  WorkerPool p({"a", "b"}, 2);
  EXPECT_EQ(p.healthy_count(), 0u);
  EXPECT_FALSE(p.Pick().has_value());
  EXPECT_TRUE(p.OnStatus(0, Ready(8)));
  EXPECT_EQ(p.Pick(), 0u);
  EXPECT_EQ(p.Free(0), 8);
  EXPECT_EQ(p.Free(1), 0);
}

TEST(WorkerPoolTest, PicksMostFreeCapacity) {
  WorkerPool p({"a", "b", "c"}, 2);
  p.OnStatus(0, Ready(8, 6));
  p.OnStatus(1, Ready(8, 1));
  p.OnStatus(2, Ready(4));
  EXPECT_EQ(p.Pick(), 1u);
  p.AddInflight(1, 5);  // our own dispatches count before the worker reports them
  EXPECT_EQ(p.Free(1), 3);
  EXPECT_EQ(p.Pick(), 2u);
  p.OnFreeSlots(2, 0, false);
  EXPECT_EQ(p.Pick(), 1u);
}

TEST(WorkerPoolTest, FullWorkersAreNotPicked) {
  WorkerPool p({"a"}, 2);
  p.OnStatus(0, Ready(2));
  p.AddInflight(0, 2);
  EXPECT_FALSE(p.Pick().has_value());
  p.AddInflight(0, -1);
  EXPECT_EQ(p.Pick(), 0u);
  p.MarkFull(0);
  EXPECT_FALSE(p.Pick().has_value());
}

// A refusal may be for lack of KV room, which free slots do not show: the worker stays full
// through its step events until one of its sequences ends (or a poll comes).
TEST(WorkerPoolTest, ARefusingWorkerStaysFullUntilOneOfItsSequencesEnds) {
  WorkerPool p({"a"}, 2);
  p.OnStatus(0, Ready(4));
  p.MarkFull(0);
  p.OnFreeSlots(0, 3, /*ended=*/false);  // a step of the sequences it runs: nothing freed
  EXPECT_FALSE(p.Pick().has_value());
  p.OnFreeSlots(0, 3, /*ended=*/true);
  EXPECT_EQ(p.Pick(), 0u);
  EXPECT_EQ(p.Free(0), 3);
  p.MarkFull(0);
  EXPECT_FALSE(p.Pick().has_value());
  p.OnStatus(0, Ready(4));  // other routers' sequences end unseen: a poll clears it too
  EXPECT_EQ(p.Pick(), 0u);
}

TEST(WorkerPoolTest, FailedPollsTakeOutAndOneGoodPollBringsBack) {
  WorkerPool p({"a"}, 2);
  p.OnStatus(0, Ready(4));
  EXPECT_FALSE(p.OnStatus(0, absl::UnavailableError("down")));  // one failure is tolerated
  EXPECT_TRUE(p.healthy(0));
  EXPECT_TRUE(p.OnStatus(0, absl::DeadlineExceededError("slow")));
  EXPECT_FALSE(p.healthy(0));
  EXPECT_TRUE(p.OnStatus(0, Ready(4)));
  EXPECT_TRUE(p.healthy(0));
}

TEST(WorkerPoolTest, NotReadyOrBrokenStreamIsOutAtOnce) {
  WorkerPool p({"a"}, 3);
  p.OnStatus(0, Ready(4));
  v1::WorkerStatus warming = Ready(4);
  warming.set_ready(false);
  EXPECT_TRUE(p.OnStatus(0, warming));
  EXPECT_FALSE(p.healthy(0));
  p.OnStatus(0, Ready(4));
  EXPECT_TRUE(p.MarkDown(0));
  EXPECT_FALSE(p.healthy(0));
  EXPECT_FALSE(p.MarkDown(0));
}

}  // namespace
}  // namespace tailserve
