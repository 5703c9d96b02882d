#pragma once
// The batching seam: the core pushes waiting requests in and asks, whenever something changes or a
// deadline passes, for a batch to dispatch. FifoBatcher is plain arrival-order batching; the
// length-aware batcher implements the same interface.
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "tailserve/v1/common.pb.h"

namespace tailserve {

struct QueuedRequest {
  uint64_t id = 0;
  v1::Priority priority = v1::PRIORITY_STANDARD;
  double predicted_steps = 0;
  SteadyTime enqueued;
};

enum class BatchReason { kFull, kMinSize, kTimeout };
std::string BatchReasonName(BatchReason r);

class Batcher {
 public:
  virtual ~Batcher() = default;
  // `requeued`: work handed back (step budget spent, worker lost) that goes before new arrivals.
  virtual void Push(const QueuedRequest& r, bool requeued) = 0;
  virtual bool Remove(uint64_t id) = 0;
  virtual size_t size() const = 0;
  // Ids of a batch to dispatch now (at most `capacity`), or none.
  virtual std::vector<uint64_t> Next(SteadyTime now, size_t capacity, BatchReason* reason) = 0;
  // When Next could return a batch with no new arrival (the oldest request's timeout), if ever.
  virtual std::optional<SteadyTime> NextDeadline() const = 0;
};

// Arrival order. A batch leaves when max_batch_size requests wait (full), when min_batch_size wait
// (min size), or when the oldest has waited router.timeout_ms (timeout; immediate_dispatch of
// whatever is there).
class FifoBatcher final : public Batcher {
 public:
  FifoBatcher(const BatchingConfig& batching, const RouterConfig& router);
  void Push(const QueuedRequest& r, bool requeued) override;
  bool Remove(uint64_t id) override;
  size_t size() const override { return queue_.size(); }
  std::vector<uint64_t> Next(SteadyTime now, size_t capacity, BatchReason* reason) override;
  std::optional<SteadyTime> NextDeadline() const override;

 private:
  const size_t max_batch_;
  const size_t min_batch_;
  const Duration timeout_;
  std::deque<QueuedRequest> queue_;
};

}  // namespace tailserve
