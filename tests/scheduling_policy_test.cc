#include "worker/scheduling_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace tailserve {
namespace {

using std::chrono::milliseconds;

const SteadyTime kNow = SteadyTime{} + std::chrono::hours(1);

WorkItem Item(int waited_ms, int priority, int64_t uncached, int generated, int max_tokens, double predicted,
              uint64_t admitted = 0) {
  WorkItem w;
  w.arrival = kNow - milliseconds(waited_ms);
  w.priority = priority;
  w.uncached_tokens = uncached;
  w.generated = generated;
  w.max_tokens = max_tokens;
  w.predicted_steps = predicted;
  w.admitted = admitted;
  return w;
}

// The same with a TTFT objective.
WorkItem WithTtft(WorkItem w, int ttft_slo_ms) {
  w.ttft_slo = milliseconds(ttft_slo_ms);
  return w;
}

SchedulingPolicy Predicted(int budget = 0) {
  SchedulingPolicy p;
  p.order = AdmissionOrder::kPredicted;
  p.victim = PreemptionVictim::kMostRemaining;
  p.reservation = KvReservation::kPredicted;
  p.aging = milliseconds(2000);
  p.step_token_budget = budget;
  return p;
}

TEST(SchedulingPolicyTest, PredictedRemainingSteps) {
  struct Case {
    const char* name;
    int generated, max_tokens;
    double predicted;
    double want;
  } cases[] = {
      {"prediction less generated", 10, 500, 100, 90},
      {"capped at max_tokens", 10, 50, 100, 40},
      {"no prediction: max_tokens left", 10, 500, 0, 490},
      {"outlived: as many again", 120, 500, 100, 120},
      {"outlived near max_tokens", 120, 130, 100, 10},
      {"outlived at the start", 0, 500, 0.5, 1},
      {"finished", 50, 50, 100, 0},
  };
  for (const Case& c : cases) {
    EXPECT_DOUBLE_EQ(PredictedRemainingSteps(Item(0, 1, 1, c.generated, c.max_tokens, c.predicted)), c.want) << c.name;
  }
}

TEST(SchedulingPolicyTest, RemainingWorkWeighsPrefillTokens) {
  struct Case {
    int64_t uncached;
    int budget;
    double weight;
    double want;  // uncached · weight (or / budget) + 40 output steps
  } cases[] = {{1, 512, 0, 40},     {2, 512, 0, 40 + 2.0 / 512}, {1024, 512, 0, 42}, {4000, 0, 0, 40},
               {1000, 512, 0.3, 340}, {1, 512, 0.3, 40}};
  for (const Case& c : cases) {
    SchedulingPolicy p;
    p.step_token_budget = c.budget;
    p.prefill_token_weight = c.weight;
    EXPECT_DOUBLE_EQ(RemainingWork(Item(0, 1, c.uncached, 0, 100, 40), p), c.want)
        << c.uncached << " tokens, budget " << c.budget << ", weight " << c.weight;
  }
}

TEST(SchedulingPolicyTest, AdmissionOrder) {
  SchedulingPolicy fcfs;
  const SchedulingPolicy pred = Predicted(512);
  struct Case {
    const char* name;
    const SchedulingPolicy& policy;
    WorkItem a, b;
    bool a_first;
  } cases[] = {
      {"fcfs: earlier arrival", fcfs, Item(100, 1, 10, 0, 500, 400), Item(50, 1, 10, 0, 500, 5), true},
      {"fcfs: ignores priority and prediction", fcfs, Item(50, 0, 10, 0, 500, 5), Item(100, 2, 10, 0, 500, 400), false},
      {"fcfs: same arrival, earlier admitted", fcfs, Item(50, 1, 10, 0, 500, 5, 2), Item(50, 1, 10, 0, 500, 5, 1), false},
      {"predicted: less remaining work", pred, Item(50, 1, 10, 0, 500, 20), Item(100, 1, 10, 0, 500, 300), true},
      {"predicted: long prompt counts", pred, Item(50, 1, 8000, 0, 500, 20), Item(100, 1, 10, 0, 500, 30), false},
      {"predicted: priority before work", pred, Item(50, 2, 10, 0, 500, 5), Item(100, 0, 10, 0, 500, 300), false},
      {"predicted: aged before priority", pred, Item(2500, 2, 10, 0, 500, 400), Item(10, 0, 10, 0, 500, 5), true},
      {"predicted: aged among themselves by arrival", pred, Item(2100, 1, 10, 0, 500, 5),
       Item(3000, 1, 10, 0, 500, 400), false},
      {"predicted: ties by arrival", pred, Item(60, 1, 10, 0, 500, 20), Item(50, 1, 10, 0, 500, 20), true},
      {"predicted: half the TTFT objective gone is urgent", pred, WithTtft(Item(600, 1, 10, 0, 500, 400), 1000),
       Item(10, 0, 10, 0, 500, 5), true},
      {"predicted: less than half is not", pred, WithTtft(Item(400, 1, 10, 0, 500, 400), 1000),
       Item(10, 1, 10, 0, 500, 5), false},
      {"predicted: started sequences have no TTFT to keep", pred, WithTtft(Item(600, 1, 1, 3, 500, 400), 1000),
       Item(10, 1, 10, 0, 500, 5), false},
      {"predicted: urgent ones earliest deadline first", pred, WithTtft(Item(600, 1, 10, 0, 500, 5), 1000),
       Item(2500, 2, 10, 0, 500, 400), false},  // 400 ms left against 500 ms past
      {"predicted: a missed objective waits its turn", pred, WithTtft(Item(1200, 1, 10, 0, 500, 400), 1000),
       Item(10, 1, 10, 0, 500, 5), false},
      {"predicted: until the aging bound", pred, WithTtft(Item(2100, 1, 10, 0, 500, 400), 1000),
       WithTtft(Item(600, 1, 10, 0, 500, 5), 1000), true},  // 100 ms past against 400 ms left
      {"predicted: a tighter objective first", pred, WithTtft(Item(300, 1, 10, 0, 500, 400), 500),
       WithTtft(Item(700, 1, 10, 0, 500, 5), 1000), true},  // 200 ms left against 300 ms
  };
  for (const Case& c : cases) {
    EXPECT_EQ(AdmitsBefore(c.a, c.b, c.policy, kNow), c.a_first) << c.name;
    EXPECT_EQ(AdmitsBefore(c.b, c.a, c.policy, kNow), !c.a_first) << c.name << " (reversed)";
  }
}

TEST(SchedulingPolicyTest, PreemptionVictim) {
  SchedulingPolicy newest;
  const SchedulingPolicy pred = Predicted();
  struct Case {
    const char* name;
    const SchedulingPolicy& policy;
    std::vector<WorkItem> running;
    size_t want;
  } cases[] = {
      {"newest admitted", newest, {Item(0, 1, 1, 5, 500, 0, 3), Item(0, 1, 1, 5, 500, 0, 7), Item(0, 1, 1, 5, 500, 0, 5)},
       1},
      {"most remaining work", pred,
       {Item(0, 1, 1, 5, 500, 50, 3), Item(0, 1, 1, 5, 500, 400, 1), Item(0, 1, 1, 5, 500, 20, 5)}, 1},
      {"lowest priority before work", pred, {Item(0, 1, 1, 5, 500, 400, 1), Item(0, 2, 1, 5, 500, 20, 2)}, 1},
      {"aged spared", pred, {Item(3000, 1, 1, 5, 500, 400, 1), Item(0, 1, 1, 5, 500, 20, 2)}, 1},
      {"urgent prefill spared", pred,
       {WithTtft(Item(600, 1, 900, 0, 500, 400, 1), 1000), Item(0, 1, 1, 5, 500, 20, 2)}, 1},
      {"only aged left: the most work", pred, {Item(3000, 1, 1, 5, 500, 40, 1), Item(2500, 1, 1, 5, 500, 90, 2)}, 1},
      {"ties: newest", pred, {Item(0, 1, 1, 5, 500, 50, 4), Item(0, 1, 1, 5, 500, 50, 3)}, 0},
  };
  for (const Case& c : cases) EXPECT_EQ(PickVictim(c.running, c.policy, kNow), c.want) << c.name;
}

TEST(SchedulingPolicyTest, AdmissionReservation) {
  SchedulingPolicy max_tokens, on_demand, pred = Predicted();
  on_demand.reservation = KvReservation::kOnDemand;
  struct Case {
    const char* name;
    const SchedulingPolicy& policy;
    WorkItem w;
    int64_t tokens, max_context, want;
  } cases[] = {
      {"max_tokens: prompt plus all output", max_tokens, Item(0, 1, 100, 0, 500, 40), 100, 4096, 600},
      {"max_tokens: resumed", max_tokens, Item(0, 1, 120, 20, 500, 40), 120, 4096, 600},
      {"max_tokens: context caps", max_tokens, Item(0, 1, 100, 0, 5000, 40), 100, 4096, 4096},
      {"on demand: the next token", on_demand, Item(0, 1, 100, 0, 500, 40), 100, 4096, 101},
      {"predicted: prediction plus 20%", pred, Item(0, 1, 100, 0, 500, 40), 100, 4096, 148},
      {"predicted: never past max_tokens", pred, Item(0, 1, 100, 0, 45, 40), 100, 4096, 145},
      {"predicted: none falls back to max_tokens", pred, Item(0, 1, 100, 0, 300, 0), 100, 4096, 400},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(AdmissionReservation(c.w, c.tokens, c.max_context, c.policy), c.want) << c.name;
  }
}

TEST(SchedulingPolicyTest, FromConfig) {
  WorkerConfig w;
  w.admission = "predicted";
  w.kv_reservation = "on_demand";
  w.preemption = "most_remaining";
  w.aging_ms = 750;
  w.step_token_budget = 256;
  const SchedulingPolicy p = PolicyFromConfig(w);
  EXPECT_EQ(p.order, AdmissionOrder::kPredicted);
  EXPECT_EQ(p.reservation, KvReservation::kOnDemand);
  EXPECT_EQ(p.victim, PreemptionVictim::kMostRemaining);
  EXPECT_EQ(p.aging, milliseconds(750));
  EXPECT_EQ(p.step_token_budget, 256);
  // The defaults are the predicted scheduler's.
  const SchedulingPolicy d = PolicyFromConfig(WorkerConfig{});
  EXPECT_EQ(d.order, AdmissionOrder::kPredicted);
  EXPECT_EQ(d.reservation, KvReservation::kPredicted);
  EXPECT_EQ(d.victim, PreemptionVictim::kMostRemaining);
  EXPECT_EQ(d.step_token_budget, 512);
  EXPECT_DOUBLE_EQ(d.step_time_target, 0.025);
}

}  // namespace
}  // namespace tailserve
