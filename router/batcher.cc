#include "router/batcher.h"

#include <algorithm>

namespace tailserve {

std::string BatchReasonName(BatchReason r) {
  switch (r) {
    case BatchReason::kFull: return "full";
    case BatchReason::kMinSize: return "min_size";
    case BatchReason::kTimeout: return "timeout";
  }
  return "unknown";
}

FifoBatcher::FifoBatcher(const BatchingConfig& batching, const RouterConfig& router)
    : max_batch_(static_cast<size_t>(batching.max_batch_size)),
      min_batch_(static_cast<size_t>(batching.min_batch_size)),
      timeout_(std::chrono::milliseconds(router.timeout_ms)) {}

void FifoBatcher::Push(const QueuedRequest& r, bool requeued) {
  if (requeued) {
    queue_.push_front(r);
  } else {
    queue_.push_back(r);
  }
}

bool FifoBatcher::Remove(uint64_t id) {
  auto it = std::find_if(queue_.begin(), queue_.end(), [id](const QueuedRequest& q) { return q.id == id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

std::vector<uint64_t> FifoBatcher::Next(SteadyTime now, size_t capacity, BatchReason* reason) {
  if (queue_.empty() || capacity == 0) return {};
  const SteadyTime oldest = std::min_element(queue_.begin(), queue_.end(), [](auto& a, auto& b) {
                              return a.enqueued < b.enqueued;
                            })->enqueued;
  if (queue_.size() >= max_batch_) {
    *reason = BatchReason::kFull;
  } else if (queue_.size() >= min_batch_) {
    *reason = BatchReason::kMinSize;
  } else if (now - oldest >= timeout_) {
    *reason = BatchReason::kTimeout;
  } else {
    return {};
  }
  const size_t n = std::min({queue_.size(), max_batch_, capacity});
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < n; ++i) {
    ids.push_back(queue_.front().id);
    queue_.pop_front();
  }
  return ids;
}

std::optional<SteadyTime> FifoBatcher::NextDeadline() const {
  if (queue_.empty()) return std::nullopt;
  SteadyTime oldest = queue_.front().enqueued;
  for (const auto& q : queue_) oldest = std::min(oldest, q.enqueued);
  return oldest + timeout_;
}

}  // namespace tailserve
