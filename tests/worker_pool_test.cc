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

v1::TokenEvent Event(int free_slots, int waiting = 0, int64_t waiting_tokens = 0) {
  v1::TokenEvent ev;
  ev.set_free_slots(free_slots);
  ev.set_waiting_sequences(waiting);
  ev.set_queued_prefill_tokens(waiting_tokens);
  return ev;
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
  p.OnEventLoad(2, Event(0), false);
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
  p.OnEventLoad(0, Event(3), /*ended=*/false);  // a step of the sequences it runs: nothing freed
  EXPECT_FALSE(p.Pick().has_value());
  p.OnEventLoad(0, Event(3), /*ended=*/true);
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


v1::WorkerStatus Queued(int slots, int running, int max_waiting, int waiting, int64_t waiting_tokens, int budget,
                        double step_p50) {
  v1::WorkerStatus s = Ready(slots, running);
  s.set_max_waiting(max_waiting);
  s.set_waiting_sequences(waiting);
  s.set_queued_prefill_tokens(waiting_tokens);
  s.set_step_token_budget(budget);
  s.set_step_time_p50_seconds(step_p50);
  return s;
}

TEST(WorkerPoolTest, AWaitingQueueIsCapacity) {
  WorkerPool p({"a"}, 2);
  p.OnStatus(0, Queued(4, 4, 8, 3, 0, 0, 0.01));
  EXPECT_EQ(p.Free(0), 5);  // 4 slots + 8 places, 7 taken
  p.OnEventLoad(0, Event(0, 7), false);
  EXPECT_EQ(p.Free(0), 1);
  p.MarkFull(0);
  EXPECT_EQ(p.Free(0), 0);
}

TEST(WorkerPoolTest, PredictedTtft) {
  WorkerPool p({"a"}, 2);
  // 10 ms steps, 512-token budget, 1,000 prompt tokens waiting; 2 running and 1 waiting leave a
  // slot for it.
  p.OnStatus(0, Queued(4, 2, 8, 1, 1000, 512, 0.010));
  struct Case {
    int64_t prompt;
    double remaining;
    double want;
  } cases[] = {
      {24, 100, 0.010 * 2},      // 1,024 tokens ahead: two steps
      {100, 100, 0.010 * 3},     // 1,100: three
      {1, 0, 0.010 * 2},
  };
  for (const Case& c : cases) EXPECT_NEAR(p.PredictTtftSeconds(0, c.prompt, c.remaining), c.want, 1e-12) << c.prompt;
  // Slots full (4 running, 2 waiting): three sequences ahead of it for one of 4 slots each, 100
  // steps left on average: 3 · 100 / 4 = 75 steps more.
  p.OnEventLoad(0, Event(0, 2, 1000), false);
  EXPECT_NEAR(p.PredictTtftSeconds(0, 24, 100), 0.010 * (2 + 75), 1e-12);
  // Without a budget every waiting prompt is a step.
  p.OnStatus(0, Queued(4, 0, 8, 3, 1000, 0, 0.010));
  EXPECT_NEAR(p.PredictTtftSeconds(0, 24, 0), 0.010 * 4, 1e-12);
}

TEST(WorkerPoolTest, PicksTheLeastPredictedTtftAndLearnsFromWhatComes) {
  WorkerPool p({"a", "b"}, 2);
  p.OnStatus(0, Queued(4, 1, 8, 0, 4000, 512, 0.010));  // a long prompt queued: 8 steps of 10 ms
  p.OnStatus(1, Queued(4, 3, 8, 0, 0, 512, 0.020));     // slower steps, nothing queued: 1 step
  EXPECT_EQ(p.PickByTtft(100, {0, 0}).value().worker, 1u);
  // First tokens on b come after 0.2 s where its load says 0.02: the correction learns the
  // ratio, for both.
  for (int i = 0; i < 200; ++i) p.ObserveTtft(p.PredictTtftSeconds(1, 100, 0), 0.2);
  EXPECT_NEAR(p.ttft_correction(), 10.0, 0.01);
  EXPECT_NEAR(p.PredictTtftSeconds(1, 100, 0), 0.2, 1e-3);
  EXPECT_EQ(p.PickByTtft(100, {0, 0}).value().worker, 1u);  // the ranking stands
  // A full worker is never picked, however fast.
  p.OnEventLoad(1, Event(0, 8, 0), false);
  EXPECT_EQ(p.PickByTtft(100, {0, 0}).value().worker, 0u);
}

TEST(WorkerPoolTest, NearTiesInPredictedTtftGoToTheLeastLoaded) {
  WorkerPool p({"a", "b", "c"}, 2);
  p.OnStatus(0, Queued(8, 5, 8, 0, 0, 512, 0.0100));
  p.OnStatus(1, Queued(8, 2, 8, 0, 0, 512, 0.0102));  // 2% slower steps, 3 fewer sequences
  p.OnStatus(2, Queued(8, 1, 8, 0, 0, 512, 0.0200));  // half the speed: no tie
  EXPECT_EQ(p.PickByTtft(10, {0, 0, 0}).value().worker, 1u);
  p.AddInflight(1, 6);  // our own dispatches count at once
  EXPECT_EQ(p.PickByTtft(10, {0, 0, 0}).value().worker, 0u);
}

// Like workers whose reported step times differ by more than 5% but less than half a step: a
// one-step prediction cannot tell them apart, so the load decides, and traffic spreads.
TEST(WorkerPoolTest, StepTimesWithinHalfAStepTieAndSpreadTheLoad) {
  WorkerPool p({"a", "b"}, 2);
  p.OnStatus(0, Queued(8, 3, 8, 0, 0, 512, 0.0030));
  p.OnStatus(1, Queued(8, 0, 8, 0, 0, 512, 0.0036));  // 20% slower report, idle
  EXPECT_EQ(p.PickByTtft(10, {0, 0}).value().worker, 1u);
  p.AddInflight(1, 4);
  EXPECT_EQ(p.PickByTtft(10, {0, 0}).value().worker, 0u);
  // A worker a whole step slower is not a tie: the faster one takes it although busier.
  WorkerPool q({"a", "b"}, 2);
  q.OnStatus(0, Queued(8, 3, 8, 0, 0, 512, 0.0030));
  q.OnStatus(1, Queued(8, 0, 8, 0, 0, 512, 0.0060));
  EXPECT_EQ(q.PickByTtft(10, {0, 0}).value().worker, 0u);
}

// A prefix cached on one worker makes it the fastest for every request sharing it; past the
// imbalance bound it is passed over while another has room, and back once the others catch up.
TEST(WorkerPoolTest, AHotPrefixCannotPinTheTrafficPastTheImbalanceBound) {
  WorkerPool p({"hot", "b", "c", "d"}, 2);
  for (size_t i = 0; i < 4; ++i) p.OnStatus(i, Queued(64, 0, 8, 0, 0, 512, 0.004));
  p.set_max_load_imbalance(1.25);
  const std::vector<int64_t> cached = {1024, 0, 0, 0};  // "hot" holds the shared 1024-token prefix
  // 2048-token prompts: uncached, four 512-token steps; on "hot", two.
  int hot = 0;
  for (int k = 0; k < 40; ++k) {
    const size_t w = p.PickByTtft(2048, {0, 0, 0, 0}, &cached).value().worker;
    p.AddInflight(w, 1);
    hot += w == 0;
  }
  // Mean 10: "hot" stops at 1.25 x mean + 1; the others share the rest.
  EXPECT_GT(hot, 10);
  EXPECT_LE(hot, 15);
  EXPECT_FALSE(p.Overloaded(1));
  p.set_max_load_imbalance(0);  // off: the cache wins every time
  EXPECT_EQ(p.PickByTtft(2048, {0, 0, 0, 0}, &cached).value().worker, 0u);
  // One worker is never overloaded.
  WorkerPool one({"a"}, 2);
  one.OnStatus(0, Queued(64, 50, 8, 0, 0, 512, 0.004));
  one.set_max_load_imbalance(1.25);
  EXPECT_FALSE(one.Overloaded(0));
}

}  // namespace
}  // namespace tailserve
