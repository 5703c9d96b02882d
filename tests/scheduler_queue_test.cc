// The worker's waiting queue end to end through the scheduler thread (the sim engine, free steps):
// admission order, the aging bound, the queue's bound, KV on demand and preemption. The policy's
// decisions alone are table-tested in scheduling_policy_test.cc.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "tests/test_sinks.h"
#include "worker/backends/sim/sim_engine.h"
#include "worker/scheduler.h"

namespace tailserve {
namespace {

using Sink = RecordingSink<v1::TokenEvent>;

SimBackendConfig FreeSim(int kv_blocks = 0) {
  SimBackendConfig c;
  c.step_base_ms = c.step_per_sequence_ms = c.step_per_kv_token_ns = c.step_per_prefill_token_ms = 0;
  c.vocab_size = 1000;
  c.kv_blocks = kv_blocks;
  return c;
}

v1::Sequence Seq(uint64_t id, int prompt, int max_tokens, double predicted = 0, int waited_ms = 0,
                 v1::Priority priority = v1::PRIORITY_STANDARD) {
  v1::Sequence s;
  s.set_sequence_id(id);
  for (int t = 0; t < prompt; ++t) s.add_prompt_token_ids(5 + t % 50);
  s.set_max_tokens(max_tokens);
  s.set_predicted_steps(predicted);
  s.set_waited_ms(waited_ms);
  s.set_priority(priority);
  s.mutable_sampling()->set_seed(id);
  return s;
}

struct QueueRun {
  std::vector<uint64_t> finish_order;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, v1::FinishState> state;
  double preemptions = 0;
  int max_waiting_seen = 0;
};

// Submits `batch` before the scheduler thread starts, so its first admission sees every sequence
// at once and orders them by the policy alone; then runs everything to the end.
QueueRun RunAll(SchedulingPolicy policy, int slots, int max_waiting, int kv_blocks, const v1::Batch& batch,
           absl::StatusCode* finish = nullptr) {
  FakeClock clock;
  SimEngine engine(FreeSim(kv_blocks), "test");
  Registry registry;
  WorkerMetrics metrics(registry, 60);
  Scheduler scheduler(engine, slots, metrics, clock);
  scheduler.SetPolicy(policy, max_waiting);
  auto sink = std::make_shared<Sink>();
  scheduler.Submit(sink, batch);
  scheduler.Start();
  const grpc::Status status = sink->WaitFinish();
  if (finish) *finish = static_cast<absl::StatusCode>(status.error_code());
  scheduler.Stop();
  QueueRun run;
  for (const v1::TokenEvent& ev : sink->messages()) {
    run.max_waiting_seen = std::max(run.max_waiting_seen, ev.waiting_sequences());
    for (const auto& se : ev.sequences()) {
      auto& t = run.tokens[se.sequence_id()];
      t.insert(t.end(), se.token_ids().begin(), se.token_ids().end());
      if (se.state() != v1::FINISH_STATE_RUNNING) {
        run.state[se.sequence_id()] = se.state();
        run.finish_order.push_back(se.sequence_id());
      }
    }
  }
  run.preemptions = metrics.preemptions.Value();
  return run;
}

SchedulingPolicy Predicted() {
  SchedulingPolicy p;
  p.order = AdmissionOrder::kPredicted;
  p.reservation = KvReservation::kPredicted;
  p.victim = PreemptionVictim::kMostRemaining;
  p.aging = std::chrono::milliseconds(2000);
  return p;
}

SchedulingPolicy VllmLike() {
  SchedulingPolicy p;
  p.reservation = KvReservation::kOnDemand;
  return p;
}

TEST(SchedulerQueueTest, AdmissionOrderFollowsThePolicy) {
  // One slot: each sequence runs alone to its end, so the finish order is the admission order.
  v1::Batch b;
  *b.add_sequences() = Seq(1, 4, 30, /*predicted=*/30);
  *b.add_sequences() = Seq(2, 4, 30, /*predicted=*/3, /*waited_ms=*/0);
  *b.add_sequences() = Seq(3, 4, 30, /*predicted=*/10, 0, v1::PRIORITY_BATCH);
  *b.add_sequences() = Seq(4, 4, 30, /*predicted=*/20, /*waited_ms=*/2500);  // past the aging bound
  *b.add_sequences() = Seq(5, 4, 30, /*predicted=*/12, 0, v1::PRIORITY_INTERACTIVE);
  struct Case {
    const char* name;
    SchedulingPolicy policy;
    std::vector<uint64_t> want;
  } cases[] = {
      // By arrival: 4 waited longest, the rest arrived together (batch order).
      {"fcfs", VllmLike(), {4, 1, 2, 3, 5}},
      // Aged first, then interactive, then standard by predicted work, then batch.
      {"predicted", Predicted(), {4, 5, 2, 1, 3}},
  };
  for (const Case& c : cases) {
    const QueueRun run = RunAll(c.policy, /*slots=*/1, /*max_waiting=*/8, /*kv_blocks=*/0, b);
    EXPECT_EQ(run.finish_order, c.want) << c.name;
    EXPECT_EQ(run.max_waiting_seen, 4) << c.name;
    for (uint64_t id = 1; id <= 5; ++id) EXPECT_EQ(run.state.at(id), v1::FINISH_STATE_LENGTH) << c.name << " " << id;
  }
}

TEST(SchedulerQueueTest, ABatchPastSlotsAndQueueIsRefusedWhole) {
  v1::Batch b;
  for (uint64_t id = 1; id <= 4; ++id) *b.add_sequences() = Seq(id, 4, 5);
  absl::StatusCode code;
  const QueueRun run = RunAll(VllmLike(), /*slots=*/1, /*max_waiting=*/2, 0, b, &code);
  EXPECT_EQ(code, absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(run.tokens.empty());
  const QueueRun fits = RunAll(VllmLike(), /*slots=*/1, /*max_waiting=*/3, 0, b, &code);
  EXPECT_EQ(code, absl::StatusCode::kOk);
  EXPECT_EQ(fits.state.size(), 4u);
}

// Two sequences grow on demand into a 4-block cache (64 positions) that holds only one at its
// full length: the cache runs out at 32 positions each and the policy's victim is recomputed
// after the other ends. Either way every token is what the sequence makes alone.
TEST(SchedulerQueueTest, ACacheShortOfGrowthPreemptsThePolicysVictim) {
  v1::Batch b;
  *b.add_sequences() = Seq(1, 3, 60, /*predicted=*/60);  // admitted first, the most work left
  *b.add_sequences() = Seq(2, 3, 40, /*predicted=*/5);
  const QueueRun alone = RunAll(VllmLike(), 2, 4, /*kv_blocks=*/0, b);
  EXPECT_EQ(alone.preemptions, 0);
  struct Case {
    const char* name;
    SchedulingPolicy policy;
    uint64_t first_to_finish;
  } cases[] = {
      {"newest", VllmLike(), 1},  // 2 was admitted last: it is recomputed
      {"most_remaining", [] {
         SchedulingPolicy p = Predicted();
         p.reservation = KvReservation::kOnDemand;  // both start small, as the newest case does
         p.order = AdmissionOrder::kFcfs;
         return p;
       }(),
       2},
  };
  for (const Case& c : cases) {
    const QueueRun run = RunAll(c.policy, 2, 4, /*kv_blocks=*/4, b);
    EXPECT_GE(run.preemptions, 1) << c.name;
    ASSERT_EQ(run.finish_order.size(), 2u) << c.name;
    EXPECT_EQ(run.finish_order[0], c.first_to_finish) << c.name;
    EXPECT_EQ(run.tokens, alone.tokens) << c.name;
    EXPECT_EQ(run.state.at(1), v1::FINISH_STATE_LENGTH);
    EXPECT_EQ(run.state.at(2), v1::FINISH_STATE_LENGTH);
  }
}

TEST(SchedulerQueueTest, APredictedReservationAdmitsWhatMaxTokensWouldNot) {
  // 8 blocks (128 positions); the sequences may write 3 + 100 and 3 + 30 positions (7 and 3
  // blocks) but are predicted to stop at 10: reserving max_tokens runs them one at a time, the
  // prediction lets both in at once, and each grows on demand past it.
  v1::Batch b;
  *b.add_sequences() = Seq(1, 3, 100, /*predicted=*/10);
  *b.add_sequences() = Seq(2, 3, 30, /*predicted=*/10);
  SchedulingPolicy max_tokens;
  const QueueRun serial = RunAll(max_tokens, 2, 4, /*kv_blocks=*/8, b);
  EXPECT_EQ(serial.finish_order, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(serial.max_waiting_seen, 1);
  const QueueRun together = RunAll(Predicted(), 2, 4, /*kv_blocks=*/8, b);
  EXPECT_EQ(together.finish_order, (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(together.max_waiting_seen, 0);
  EXPECT_EQ(together.tokens, serial.tokens);
}

TEST(SchedulerQueueTest, ASequenceLongerThanTheWholeCacheIsRefusedAlone) {
  v1::Batch b;
  *b.add_sequences() = Seq(1, 70, 10);  // 70 prompt tokens: 5 blocks, the cache has 4
  *b.add_sequences() = Seq(2, 3, 10);
  const QueueRun run = RunAll(VllmLike(), 2, 4, /*kv_blocks=*/4, b);
  EXPECT_EQ(run.state.at(1), v1::FINISH_STATE_INVALID);
  EXPECT_EQ(run.state.at(2), v1::FINISH_STATE_LENGTH);
}


// Grown on demand, a sequence can outgrow the whole cache (here 4 blocks, 64 positions, for 3 +
// 100): it ends there alone, with the cache's reason, after the tokens it could make; its batch
// mate is untouched.
TEST(SchedulerQueueTest, ASequenceOutgrowingTheWholeCacheEndsAloneWithTheReason) {
  v1::Batch b;
  *b.add_sequences() = Seq(1, 3, 100);
  *b.add_sequences() = Seq(2, 3, 10);
  const QueueRun run = RunAll(VllmLike(), 2, 4, /*kv_blocks=*/4, b);
  EXPECT_EQ(run.state.at(1), v1::FINISH_STATE_INVALID);
  EXPECT_EQ(run.tokens.at(1).size(), 61u);  // 64 positions: 3 prompt tokens and 61 generated
  EXPECT_EQ(run.state.at(2), v1::FINISH_STATE_LENGTH);
  EXPECT_EQ(run.tokens.at(2).size(), 10u);
}

// A burst of long prompts arrives while eight sequences decode: whole prompts stall those
// sequences for a whole prefill (their time per output token is the step's time), a step-token
// budget bounds every step, and a step-time target lets steps grow to it and no further. Steps
// cost what the sim's cost model says, on an injected clock; the step after which the burst is
// submitted waits for it, so every arm sees the same moment.
TEST(SchedulerQueueTest, ALongPromptBurstStaysWithinTheStepBound) {
  SimBackendConfig cost = FreeSim();
  cost.step_base_ms = 4, cost.step_per_sequence_ms = 0.02, cost.step_per_kv_token_ns = 15;
  cost.step_per_prefill_token_ms = 0.03;
  constexpr size_t kBurstAfter = 80;  // steps: the step cost is learned by then
  struct Case {
    const char* name;
    int budget;
    double target_ms;
  } cases[] = {{"whole prompts", 0, 0}, {"budget 256", 256, 0}, {"target 25 ms", 64, 25}};
  for (const Case& c : cases) {
    FakeClock clock;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<double> steps;
    bool burst_sent = false;
    SimEngine engine(cost, "test", clock, [&](SteadyTime t) {
      std::unique_lock lock(mu);
      steps.push_back(Seconds(t - clock.Now()));
      clock.Advance(t - clock.Now());
      if (steps.size() == kBurstAfter) {
        cv.notify_all();
        cv.wait(lock, [&] { return burst_sent; });
      }
    });
    Registry registry;
    WorkerMetrics metrics(registry, 60);
    Scheduler scheduler(engine, 16, metrics, clock);
    SchedulingPolicy policy = VllmLike();
    policy.step_token_budget = c.budget;
    policy.step_time_target = c.target_ms * 1e-3;
    scheduler.SetPolicy(policy, 16);
    v1::Batch running;
    for (uint64_t id = 1; id <= 8; ++id) *running.add_sequences() = Seq(id, 80, 400);
    auto sink = std::make_shared<Sink>();
    scheduler.Submit(sink, running);
    scheduler.Start();
    {
      std::unique_lock lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return steps.size() >= kBurstAfter; }));
    }
    v1::Batch burst;
    for (uint64_t id = 11; id <= 13; ++id) *burst.add_sequences() = Seq(id, 2000, 2);
    auto burst_sink = std::make_shared<Sink>();
    scheduler.Submit(burst_sink, burst);
    {
      std::lock_guard lock(mu);
      burst_sent = true;
      cv.notify_all();
    }
    ASSERT_TRUE(burst_sink->WaitFinish().ok()) << c.name;
    ASSERT_TRUE(sink->WaitFinish().ok()) << c.name;
    scheduler.Stop();
    std::lock_guard lock(mu);
    const double worst = *std::max_element(steps.begin() + kBurstAfter, steps.end());
    // Every step of the burst holds at most 11 sequences and 8·480 + 3·2000 KV tokens: with 256
    // new tokens at most, a + 11b + c·kv + 256p = 12.0 ms.
    const double budget_bound = 4e-3 + 11 * 2e-5 + 15e-9 * (8 * 480 + 3 * 2000) + 256 * 3e-5;
    if (c.budget == 0) {
      EXPECT_GT(worst, 2000 * 3e-5) << c.name << ": a whole 2,000-token prompt in one step";
    } else if (c.target_ms == 0) {
      EXPECT_LE(worst, budget_bound) << c.name;
    } else {
      EXPECT_LE(worst, c.target_ms * 1e-3 * 1.001) << c.name;
      EXPECT_GT(worst, budget_bound) << c.name << ": the target's room is used";
    }
  }
}

}  // namespace
}  // namespace tailserve
