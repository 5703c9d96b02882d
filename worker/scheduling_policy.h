#pragma once
// The worker's scheduling decisions as plain functions of what it knows about each sequence: the
// order its waiting queue is admitted in, how much KV cache a sequence is promised at admission,
// and which running sequence gives up its cache when the cache runs out. Pure (no engine, no
// clock reads: `now` is passed in), so each decision is tested table-driven on the CPU.
//
// Two policies, each switchable alone (worker.* in ladb_config.yaml):
//  - what a stock vLLM v1 engine does: admit first come first served, KV on demand, preempt the
//    newest sequence (recompute);
//  - the predicted policy: admit the least predicted remaining work first (SRPT: short requests
//    no longer wait behind long ones), with aging so none waits past a bound, reserve KV for the
//    prediction plus a margin, and preempt the sequence with the lowest priority and the most
//    predicted work left (it loses the least by being recomputed later, and frees the most).
#include <cstdint>
#include <span>

#include "common/clock.h"
#include "common/config.h"

namespace tailserve {

enum class AdmissionOrder { kFcfs, kPredicted };
enum class KvReservation { kMaxTokens, kOnDemand, kPredicted };
enum class PreemptionVictim { kNewest, kMostRemaining };

struct SchedulingPolicy {
  AdmissionOrder order = AdmissionOrder::kFcfs;
  // A sequence that has waited this long since its request arrived goes before every other
  // (oldest first), whatever its prediction or priority: the bound on starvation.
  Duration aging = std::chrono::seconds(2);
  KvReservation reservation = KvReservation::kMaxTokens;
  // kPredicted promises the predicted remaining output times (1 + margin).
  double reservation_margin = 0.2;
  PreemptionVictim victim = PreemptionVictim::kNewest;
  // New tokens an engine step computes (0: unbounded); prefill cost in slot-steps divides by it.
  int step_token_budget = 0;
  // With a target (seconds, 0: none), a step takes as many prefill tokens as the learned step
  // cost says keep it within the target, and never fewer than step_token_budget allows.
  double step_time_target = 0;
  // What one prefill token costs the worker against one decode step of one sequence (both take
  // from the same steps); the scheduler sets it from its learned step cost. 0: not known yet, and
  // a prompt counts as the steps it takes under step_token_budget (none without one).
  double prefill_token_weight = 0;
};

// The worker.* settings (validated by ParseConfig) as a policy.
SchedulingPolicy PolicyFromConfig(const WorkerConfig& w);

// What the policy reads of one sequence, waiting or running.
struct WorkItem {
  SteadyTime arrival{};         // when its request reached the router
  int priority = 1;             // 0 interactive, 1 standard, 2 batch: lower goes first
  int64_t uncached_tokens = 0;  // prompt (and resumed) tokens not in the cache yet
  int32_t generated = 0;        // output tokens so far
  int32_t max_tokens = 0;       // output tokens allowed in all
  double predicted_steps = 0;   // the router's prediction of its output length; 0: none
  uint64_t admitted = 0;        // admission counter: larger is newer
  Duration ttft_slo{};          // the request's time-to-first-token objective; 0: none
};

// Output steps still to come: the prediction less what is generated; once a sequence outlives
// its prediction, as many again as it has generated (a doubling estimate), and with no
// prediction max_tokens; never past max_tokens.
double PredictedRemainingSteps(const WorkItem& w);
// The worker time the sequence still needs, in decode steps of one sequence: its remaining
// output steps plus its uncached tokens at the policy's prefill_token_weight (a prompt of a
// thousand tokens costs as much as ~300 output tokens on the sim's 8B cost model, so ordering
// by output length alone would put long prompts first whenever they are predicted short).
double RemainingWork(const WorkItem& w, const SchedulingPolicy& p);
// Whether a sequence is urgent: one without a token yet and with a TTFT objective from half of the
// objective until the whole has passed since its request arrived (then it has missed it), and any
// sequence once it has waited the aging bound.
bool Urgent(const WorkItem& w, const SchedulingPolicy& p, SteadyTime now);
// Whether `a` is admitted (and prefilled) before `b`. kFcfs: arrival. kPredicted: urgent
// sequences first, earliest deadline first (arrival plus the TTFT objective, or plus the aging
// bound), then priority, then least remaining work, then arrival.
bool AdmitsBefore(const WorkItem& a, const WorkItem& b, const SchedulingPolicy& p, SteadyTime now);
// Index of the running sequence that gives up its KV cache. kNewest: the latest admitted.
// kMostRemaining: the lowest priority, then the most remaining work, then the newest. Urgent
// sequences are taken only when nothing else is left. `running` must not be empty.
size_t PickVictim(std::span<const WorkItem> running, const SchedulingPolicy& p, SteadyTime now);
// Tokens of KV cache promised at admission to a sequence holding `tokens` tokens now, capped at
// `max_context`: its whole max_tokens (kMaxTokens), the next token only (kOnDemand), or the
// predicted remaining output plus the margin (kPredicted).
int64_t AdmissionReservation(const WorkItem& w, int64_t tokens, int64_t max_context, const SchedulingPolicy& p);

}  // namespace tailserve
