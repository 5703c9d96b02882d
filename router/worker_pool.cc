#include "router/worker_pool.h"

#include <algorithm>
#include <cmath>

namespace tailserve {

WorkerPool::WorkerPool(std::vector<std::string> addresses, int unhealthy_after_failures)
    : unhealthy_after_(unhealthy_after_failures) {
  for (auto& a : addresses) workers_.push_back(Worker{std::move(a)});
}

size_t WorkerPool::healthy_count() const {
  return std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.healthy; });
}

bool WorkerPool::OnStatus(size_t i, const absl::StatusOr<v1::WorkerStatus>& status) {
  Worker& w = workers_[i];
  const bool was = w.healthy;
  if (status.ok() && status->ready()) {
    w.failures = 0;
    w.healthy = true;
    w.total_slots = status->total_slots();
    w.running_reported = status->running_sequences();
    w.waiting_reported = status->waiting_sequences();
    w.prefilling_reported = status->prefilling_sequences();
    w.max_waiting = status->max_waiting();
    w.queued_prefill_tokens = status->queued_prefill_tokens();
    w.step_token_budget = status->step_token_budget();
    w.refused = false;
    w.step_p50_seconds = status->step_time_p50_seconds();
  } else if (status.ok()) {
    w.healthy = false;  // reachable but not ready (warming up or shutting down)
  } else if (++w.failures >= unhealthy_after_) {
    w.healthy = false;  // unreachable for N polls in a row
  }
  return was != w.healthy;
}

bool WorkerPool::MarkDown(size_t i) {
  Worker& w = workers_[i];
  const bool was = w.healthy;
  w.healthy = false;
  w.failures = std::max(w.failures, unhealthy_after_);
  return was;
}

void WorkerPool::MarkFull(size_t i) {
  workers_[i].running_reported = workers_[i].total_slots;
  workers_[i].waiting_reported = workers_[i].max_waiting;
  workers_[i].refused = true;
}

void WorkerPool::OnEventLoad(size_t i, const v1::TokenEvent& ev, bool ended) {
  Worker& w = workers_[i];
  if (w.refused && !ended) return;
  w.refused = false;
  w.running_reported = std::max(0, w.total_slots - ev.free_slots());
  w.waiting_reported = ev.waiting_sequences();
  w.prefilling_reported = ev.prefilling_sequences();
  w.queued_prefill_tokens = ev.queued_prefill_tokens();
}

int WorkerPool::Load(size_t i) const {
  const Worker& w = workers_[i];
  return std::max(w.inflight, w.running_reported + w.waiting_reported);
}

int WorkerPool::Free(size_t i) const {
  const Worker& w = workers_[i];
  if (!w.healthy) return 0;
  return std::max(0, w.total_slots + w.max_waiting - Load(i));
}

double WorkerPool::StepSeconds(size_t i) const {
  // Before a step-time report: the pool's mean, or a nominal 10 ms decode step.
  double step = workers_[i].step_p50_seconds;
  if (step <= 0) step = MeanStepSeconds();
  return step > 0 ? step : 0.01;
}

double WorkerPool::PredictTtftSeconds(size_t i, int64_t prompt_tokens, double remaining_steps) const {
  const Worker& w = workers_[i];
  const double step = StepSeconds(i);
  const int64_t ahead = w.queued_prefill_tokens + std::max<int64_t>(1, prompt_tokens);
  const double prefill_steps =
      w.step_token_budget > 0 ? std::ceil(static_cast<double>(ahead) / w.step_token_budget) : w.waiting_reported + 1;
  const int over = std::max(0, Load(i) + 1 - w.total_slots);
  const double slot_wait_steps = w.total_slots > 0 ? over * std::max(0.0, remaining_steps) / w.total_slots : 0;
  return ttft_correction_ * step * (prefill_steps + slot_wait_steps);
}

bool WorkerPool::Overloaded(size_t i) const {
  if (max_imbalance_ <= 0) return false;
  int total = 1, healthy = 0;
  for (size_t k = 0; k < workers_.size(); ++k) {
    if (!workers_[k].healthy) continue;
    total += Load(k);
    ++healthy;
  }
  return healthy > 1 && Load(i) + 1 > max_imbalance_ * total / healthy + 1;
}

std::optional<WorkerPool::TtftPick> WorkerPool::BestTtft(int64_t prompt_tokens, const std::vector<double>& remaining_steps,
                                                         const std::vector<int64_t>* cached) const {
  std::optional<TtftPick> best;
  const size_t n = workers_.size();
  bool balanced_room = false;  // some worker has room and is not overloaded
  for (size_t i = 0; i < n; ++i) balanced_room = balanced_room || (Free(i) > 0 && !Overloaded(i));
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (rotate_ + k) % n;
    if (Free(i) <= 0 || (balanced_room && Overloaded(i))) continue;
    const int64_t uncached = prompt_tokens - (cached && i < cached->size() ? (*cached)[i] : 0);
    const double t = PredictTtftSeconds(i, uncached, i < remaining_steps.size() ? remaining_steps[i] : 0);
    // Predictions closer than half a step (or 5%) are ties, broken by load: a prediction counts
    // whole steps, and between like workers a step time reported a little faster (noise, or the
    // other's stale report) must not draw every request to one worker, whose decode they slow.
    const double half_step =
        best ? 0.5 * ttft_correction_ * std::min(StepSeconds(i), StepSeconds(best->worker)) : 0.0;
    const double resolution = std::max(0.05 * std::max(t, best ? best->ttft_seconds : 0.0), half_step);
    const bool tie = best && std::abs(t - best->ttft_seconds) <= resolution;
    // Within a tie, the worker holding a block more of the prompt: predictions count whole steps,
    // so a prompt that fits one step ties everywhere however much of it is cached (the load bound
    // above keeps this from pinning a hot prefix); then the least loaded.
    const int64_t mine = cached && i < cached->size() ? (*cached)[i] : 0;
    const int64_t theirs = best && cached && best->worker < cached->size() ? (*cached)[best->worker] : 0;
    const bool more_cached = mine >= theirs + 16, less_cached = theirs >= mine + 16;
    if (!best || (tie ? more_cached || (!less_cached && Load(i) < Load(best->worker)) : t < best->ttft_seconds)) {
      best = TtftPick{i, t};
    }
  }
  return best;
}

std::optional<WorkerPool::TtftPick> WorkerPool::PickByTtft(int64_t prompt_tokens, const std::vector<double>& remaining_steps,
                                                           const std::vector<int64_t>* cached) {
  const std::optional<TtftPick> best = BestTtft(prompt_tokens, remaining_steps, cached);
  if (best) rotate_ = (best->worker + 1) % workers_.size();
  return best;
}

void WorkerPool::ObserveTtft(double predicted, double actual) {
  if (predicted <= 0 || actual < 0) return;
  // The prediction without the correction, so the correction converges to the ratio itself.
  const double ratio = std::clamp(actual / (predicted / ttft_correction_), 0.1, 100.0);
  ttft_correction_ = 0.95 * ttft_correction_ + 0.05 * ratio;
}

double WorkerPool::MeanStepSeconds() const {
  double sum = 0;
  int n = 0;
  for (const Worker& w : workers_) {
    if (!w.healthy || w.step_p50_seconds <= 0) continue;
    sum += w.step_p50_seconds;
    ++n;
  }
  return n ? sum / n : 0;
}

std::optional<size_t> WorkerPool::Pick() {
  std::optional<size_t> best;
  const size_t n = workers_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (rotate_ + k) % n;
    if (Free(i) <= 0) continue;
    if (!best || Free(i) > Free(*best) || (Free(i) == Free(*best) && workers_[i].inflight < workers_[*best].inflight)) {
      best = i;
    }
  }
  if (best) rotate_ = (*best + 1) % n;
  return best;
}

}  // namespace tailserve
