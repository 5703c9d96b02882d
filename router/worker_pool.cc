#include "router/worker_pool.h"

#include <algorithm>

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
  workers_[i].refused = true;
}

void WorkerPool::OnFreeSlots(size_t i, int free_slots, bool ended) {
  Worker& w = workers_[i];
  if (w.refused && !ended) return;
  w.refused = false;
  w.running_reported = std::max(0, w.total_slots - free_slots);
}

int WorkerPool::Free(size_t i) const {
  const Worker& w = workers_[i];
  if (!w.healthy) return 0;
  return std::max(0, w.total_slots - std::max(w.inflight, w.running_reported));
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
