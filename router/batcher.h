#pragma once
// The batching seam: the core pushes waiting requests in and asks, whenever something changes or a
// deadline passes, for a batch to dispatch.
//
// LadbBatcher (latency-aware dynamic batching) groups requests whose predicted decode steps lie
// within +-variance_tolerance of an anchor's. Anchors are tried most urgent first: requests that
// waited router.max_wait_ms (bounded wait, oldest first), then by priority class, then shortest
// prediction (queue_strategy priority_by_remaining_steps; "fifo" keeps arrival order). A group
// leaves when it is full (max_batch_size), reaches min_batch_size, or its anchor has waited as long
// as it may (fallback immediate_dispatch: it goes with whatever is in its group, alone if need be).
// Latency-aware wait: a request may wait for batch mates only for the slack its latency target
// leaves, target_latency_ms - predicted_steps * measured step time, and never beyond
// router.timeout_ms; a request predicted to need the whole target goes at once. (Workers batch
// continuously, so a short request never waits for a long batch mate there: waiting at the router
// is only worth what the target can spare.) Length-unaware (batching.mode fifo, or predictor drift)
// it is plain FIFO batching: min_batch_size or timeout_ms over arrival order, no grouping.
#include <cstdint>
#include <deque>
#include <memory>
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
  double predicted_steps = 0;  // remaining decode steps
  SteadyTime enqueued;
};

enum class BatchReason { kFull, kMinSize, kTimeout, kImmediate };
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
  // Off: plain FIFO batching (the fallback while predictions are not trusted).
  virtual void SetLengthAware(bool on) = 0;
  virtual bool length_aware() const = 0;
  // The workers' current decode step time (0: unknown), for the latency-aware wait.
  virtual void SetStepSeconds(double seconds) = 0;
};

class LadbBatcher final : public Batcher {
 public:
  LadbBatcher(const BatchingConfig& batching, const RouterConfig& router);
  void Push(const QueuedRequest& r, bool requeued) override;
  bool Remove(uint64_t id) override;
  size_t size() const override { return queue_.size(); }
  std::vector<uint64_t> Next(SteadyTime now, size_t capacity, BatchReason* reason) override;
  std::optional<SteadyTime> NextDeadline() const override;
  void SetLengthAware(bool on) override { length_aware_ = on; }
  bool length_aware() const override { return length_aware_; }
  void SetStepSeconds(double seconds) override { step_seconds_ = seconds; }

 private:
  std::vector<uint64_t> NextFifo(SteadyTime now, size_t limit, BatchReason* reason);
  std::vector<uint64_t> NextGrouped(SteadyTime now, size_t limit, BatchReason* reason);
  std::vector<uint64_t> Take(const std::vector<size_t>& positions);
  // How long this request may wait for batch mates.
  Duration WaitLimit(const QueuedRequest& q) const;

  const size_t max_batch_;
  const size_t min_batch_;
  const double tolerance_;
  const Duration timeout_;
  const Duration max_wait_;
  const double target_seconds_;
  double step_seconds_ = 0;
  const bool by_remaining_steps_;
  bool length_aware_;
  std::vector<QueuedRequest> queue_;  // arrival order; re-queued work in front
};

// The honest baseline (batching.mode fcfs): what a stock vLLM-like cluster does. Each request is
// dispatched the moment a worker has room, alone, to the worker with the most free slots (the core
// picks one for every request), in arrival order (work handed back first); no waiting, no grouping,
// no prediction. Every scheduling result is measured against it.
class FcfsBatcher final : public Batcher {
 public:
  void Push(const QueuedRequest& r, bool requeued) override;
  bool Remove(uint64_t id) override;
  size_t size() const override { return queue_.size(); }
  std::vector<uint64_t> Next(SteadyTime now, size_t capacity, BatchReason* reason) override;
  std::optional<SteadyTime> NextDeadline() const override { return std::nullopt; }
  void SetLengthAware(bool) override {}
  bool length_aware() const override { return false; }
  void SetStepSeconds(double) override {}

 private:
  std::deque<QueuedRequest> queue_;  // arrival order; re-queued work in front
};

// The batcher batching.mode names: fcfs, or LADB (ladb, fifo).
std::unique_ptr<Batcher> MakeBatcher(const BatchingConfig& batching, const RouterConfig& router);

}  // namespace tailserve
