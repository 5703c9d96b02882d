#include "worker/scheduling_policy.h"

#include <algorithm>
#include <cmath>
#include <tuple>


namespace tailserve {

SchedulingPolicy PolicyFromConfig(const WorkerConfig& w) {
  SchedulingPolicy p;
  p.order = w.admission == "predicted" ? AdmissionOrder::kPredicted : AdmissionOrder::kFcfs;
  p.aging = std::chrono::milliseconds(w.aging_ms);
  p.reservation = w.kv_reservation == "on_demand"   ? KvReservation::kOnDemand
                  : w.kv_reservation == "predicted" ? KvReservation::kPredicted
                                                    : KvReservation::kMaxTokens;
  p.reservation_margin = w.kv_reservation_margin;
  p.victim = w.preemption == "most_remaining" ? PreemptionVictim::kMostRemaining : PreemptionVictim::kNewest;
  p.step_token_budget = w.step_token_budget;
  p.step_time_target = w.step_time_target_ms * 1e-3;
  return p;
}

double PredictedRemainingSteps(const WorkItem& w) {
  const double cap = std::max(0, w.max_tokens - w.generated);
  if (w.predicted_steps <= 0) return cap;
  const double left = w.predicted_steps - w.generated;
  return std::min(cap, left >= 1 ? left : std::max(1, w.generated));
}

double RemainingWork(const WorkItem& w, const SchedulingPolicy& p) {
  double per_token = p.prefill_token_weight;
  if (per_token <= 0) per_token = p.step_token_budget > 0 ? 1.0 / p.step_token_budget : 0;
  const double prefill = w.uncached_tokens > 1 ? static_cast<double>(w.uncached_tokens) * per_token : 0;
  return prefill + PredictedRemainingSteps(w);
}

namespace {

bool TtftBound(const WorkItem& w) { return w.generated == 0 && w.ttft_slo > Duration::zero(); }

// When an urgent sequence's time is up: its TTFT objective while it can still meet it, else the
// aging bound.
SteadyTime Deadline(const WorkItem& w, const SchedulingPolicy& p, SteadyTime now) {
  return w.arrival + (TtftBound(w) && now - w.arrival < w.ttft_slo ? w.ttft_slo : p.aging);
}

}  // namespace

bool Urgent(const WorkItem& w, const SchedulingPolicy& p, SteadyTime now) {
  const Duration waited = now - w.arrival;
  // At risk of missing its TTFT objective: urgent until it has missed it anyway. Then it waits its
  // turn by work like any other until the aging bound, rather than push the next ones past their
  // objectives too (under overload, deadline order alone makes every request late).
  if (TtftBound(w) && waited >= w.ttft_slo / 2 && waited < w.ttft_slo) return true;
  return waited >= p.aging;
}

bool AdmitsBefore(const WorkItem& a, const WorkItem& b, const SchedulingPolicy& p, SteadyTime now) {
  if (p.order == AdmissionOrder::kFcfs) return std::tie(a.arrival, a.admitted) < std::tie(b.arrival, b.admitted);
  const bool urgent_a = Urgent(a, p, now), urgent_b = Urgent(b, p, now);
  if (urgent_a != urgent_b) return urgent_a;
  if (urgent_a && Deadline(a, p, now) != Deadline(b, p, now)) return Deadline(a, p, now) < Deadline(b, p, now);
  if (a.priority != b.priority) return a.priority < b.priority;
  const double wa = RemainingWork(a, p), wb = RemainingWork(b, p);
  if (wa != wb) return wa < wb;
  return a.arrival < b.arrival;
}

size_t PickVictim(std::span<const WorkItem> running, const SchedulingPolicy& p, SteadyTime now) {
  size_t best = 0;
  for (size_t i = 1; i < running.size(); ++i) {
    const WorkItem& a = running[i];
    const WorkItem& b = running[best];
    bool better;
    if (p.victim == PreemptionVictim::kNewest) {
      better = a.admitted > b.admitted;
    } else {
      const bool urgent_a = Urgent(a, p, now), urgent_b = Urgent(b, p, now);
      if (urgent_a != urgent_b) {
        better = !urgent_a;
      } else if (a.priority != b.priority) {
        better = a.priority > b.priority;
      } else {
        const double wa = RemainingWork(a, p), wb = RemainingWork(b, p);
        better = wa != wb ? wa > wb : a.admitted > b.admitted;
      }
    }
    if (better) best = i;
  }
  return best;
}

int64_t AdmissionReservation(const WorkItem& w, int64_t tokens, int64_t max_context, const SchedulingPolicy& p) {
  int64_t want = tokens + 1;
  switch (p.reservation) {
    case KvReservation::kMaxTokens:
      want = tokens + std::max(1, w.max_tokens - w.generated);
      break;
    case KvReservation::kOnDemand:
      break;
    case KvReservation::kPredicted:
      want = tokens + std::clamp<int64_t>(
                          static_cast<int64_t>(std::ceil(PredictedRemainingSteps(w) * (1 + p.reservation_margin))), 1,
                          std::max(1, w.max_tokens - w.generated));
      break;
  }
  return std::min(want, max_context);
}

}  // namespace tailserve
