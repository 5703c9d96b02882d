#include "router/batcher.h"

#include <algorithm>
#include <numeric>

namespace tailserve {
namespace {

// Anchors tried per call: enough to find any ready group in practice, bounded for a long queue.
constexpr size_t kMaxAnchors = 64;

int ClassRank(v1::Priority p) {
  switch (p) {
    case v1::PRIORITY_INTERACTIVE: return 0;
    case v1::PRIORITY_BATCH: return 2;
    default: return 1;
  }
}

}  // namespace

std::string BatchReasonName(BatchReason r) {
  switch (r) {
    case BatchReason::kFull: return "full";
    case BatchReason::kMinSize: return "min_size";
    case BatchReason::kTimeout: return "timeout";
    case BatchReason::kImmediate: return "immediate";
  }
  return "unknown";
}

LadbBatcher::LadbBatcher(const BatchingConfig& batching, const RouterConfig& router)
    : max_batch_(static_cast<size_t>(batching.max_batch_size)),
      min_batch_(static_cast<size_t>(batching.min_batch_size)),
      tolerance_(batching.variance_tolerance),
      timeout_(std::chrono::milliseconds(router.timeout_ms)),
      max_wait_(std::chrono::milliseconds(router.max_wait_ms)),
      target_seconds_(batching.target_latency_ms / 1000.0),
      by_remaining_steps_(router.queue_strategy == "priority_by_remaining_steps"),
      length_aware_(batching.mode == "ladb") {}

void LadbBatcher::Push(const QueuedRequest& r, bool requeued) {
  queue_.insert(requeued ? queue_.begin() : queue_.end(), r);
}

bool LadbBatcher::Remove(uint64_t id) {
  auto it = std::find_if(queue_.begin(), queue_.end(), [id](const QueuedRequest& q) { return q.id == id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

Duration LadbBatcher::WaitLimit(const QueuedRequest& q) const {
  if (!length_aware_ || step_seconds_ <= 0) return timeout_;
  const double slack = target_seconds_ - q.predicted_steps * step_seconds_;
  if (slack <= 0) return Duration::zero();
  return std::min(timeout_, std::chrono::duration_cast<Duration>(std::chrono::duration<double>(slack)));
}

std::optional<SteadyTime> LadbBatcher::NextDeadline() const {
  std::optional<SteadyTime> next;
  for (const auto& q : queue_) {
    const SteadyTime t = q.enqueued + WaitLimit(q);
    if (!next || t < *next) next = t;
  }
  return next;
}

std::vector<uint64_t> LadbBatcher::Take(const std::vector<size_t>& positions) {
  std::vector<uint64_t> ids;
  for (size_t p : positions) ids.push_back(queue_[p].id);
  std::vector<size_t> sorted = positions;
  std::sort(sorted.rbegin(), sorted.rend());
  for (size_t p : sorted) queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(p));
  return ids;
}

std::vector<uint64_t> LadbBatcher::Next(SteadyTime now, size_t capacity, BatchReason* reason) {
  if (queue_.empty() || capacity == 0) return {};
  const size_t limit = std::min(max_batch_, capacity);
  return length_aware_ ? NextGrouped(now, limit, reason) : NextFifo(now, limit, reason);
}

std::vector<uint64_t> LadbBatcher::NextFifo(SteadyTime now, size_t limit, BatchReason* reason) {
  if (queue_.size() >= max_batch_) {
    *reason = BatchReason::kFull;
  } else if (queue_.size() >= min_batch_) {
    *reason = BatchReason::kMinSize;
  } else if (now >= *NextDeadline()) {
    *reason = BatchReason::kTimeout;
  } else {
    return {};
  }
  std::vector<size_t> positions(std::min(limit, queue_.size()));
  std::iota(positions.begin(), positions.end(), size_t{0});
  return Take(positions);
}

std::vector<uint64_t> LadbBatcher::NextGrouped(SteadyTime now, size_t limit, BatchReason* reason) {
  // Urgency order: overdue (bounded wait) first, oldest first; then class; then shortest predicted
  // (or arrival order under queue_strategy fifo).
  std::vector<size_t> order(queue_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto key = [&](size_t i) {
    const QueuedRequest& q = queue_[i];
    const bool overdue = now - q.enqueued >= max_wait_;
    const double rank = overdue ? 0 : 1 + ClassRank(q.priority);
    const double within = overdue || !by_remaining_steps_ ? 0.0 : q.predicted_steps;
    return std::tuple(rank, within, q.enqueued, i);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });

  for (size_t n = 0; n < order.size() && n < kMaxAnchors; ++n) {
    const QueuedRequest& anchor = queue_[order[n]];
    const double lo = anchor.predicted_steps * (1 - tolerance_), hi = anchor.predicted_steps * (1 + tolerance_);
    std::vector<size_t> group{order[n]};
    for (size_t m = 0; m < order.size() && group.size() < limit; ++m) {
      const double p = queue_[order[m]].predicted_steps;
      if (m != n && p >= lo && p <= hi) group.push_back(order[m]);
    }
    if (group.size() >= max_batch_) {
      *reason = BatchReason::kFull;
    } else if (group.size() >= min_batch_) {
      *reason = BatchReason::kMinSize;
    } else if (now - anchor.enqueued >= WaitLimit(anchor)) {
      *reason = BatchReason::kTimeout;
    } else {
      continue;
    }
    return Take(group);
  }
  return {};
}

void FcfsBatcher::Push(const QueuedRequest& r, bool requeued) {
  if (requeued) {
    queue_.push_front(r);
  } else {
    queue_.push_back(r);
  }
}

bool FcfsBatcher::Remove(uint64_t id) {
  auto it = std::find_if(queue_.begin(), queue_.end(), [id](const QueuedRequest& q) { return q.id == id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

std::vector<uint64_t> FcfsBatcher::Next(SteadyTime, size_t capacity, BatchReason* reason) {
  if (queue_.empty() || capacity == 0) return {};
  *reason = BatchReason::kImmediate;
  const uint64_t id = queue_.front().id;
  queue_.pop_front();
  return {id};
}

std::unique_ptr<Batcher> MakeBatcher(const BatchingConfig& batching, const RouterConfig& router) {
  // slo dispatches at once too: its order is made in the worker queues, by prediction.
  if (batching.mode == "fcfs" || batching.mode == "slo") return std::make_unique<FcfsBatcher>();
  return std::make_unique<LadbBatcher>(batching, router);
}

}  // namespace tailserve
