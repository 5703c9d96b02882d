#pragma once
// What the router knows about its workers: health (from Status polls and stream failures) and free
// capacity. Owned by the core thread; no locking.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tailserve/v1/worker.pb.h"

namespace tailserve {

class WorkerPool {
 public:
  WorkerPool(std::vector<std::string> addresses, int unhealthy_after_failures);

  size_t size() const { return workers_.size(); }
  const std::string& address(size_t i) const { return workers_[i].address; }
  bool healthy(size_t i) const { return workers_[i].healthy; }
  size_t healthy_count() const;

  // A Status poll answered (or failed). Returns true when the worker's health changed.
  bool OnStatus(size_t i, const absl::StatusOr<v1::WorkerStatus>& status);
  // An Execute stream to the worker broke: out of rotation until a Status poll succeeds again.
  // Returns true when the worker was healthy.
  bool MarkDown(size_t i);
  // The worker refused a batch (no slots, or no room in its KV cache, which free slots do not
  // show): full until one of its sequences ends, the only thing that frees either, or until a
  // Status poll (other routers' sequences end unseen). Clearing it on every step event made a
  // worker with a full KV cache refuse a batch each step.
  void MarkFull(size_t i);
  // Free slots as reported in a TokenEvent (fresher than the last poll); `ended`: the event ends
  // at least one sequence.
  void OnFreeSlots(size_t i, int free_slots, bool ended);

  void AddInflight(size_t i, int delta) { workers_[i].inflight += delta; }
  int inflight(size_t i) const { return workers_[i].inflight; }
  // Slots a new batch may take on worker i (0 when unhealthy).
  int Free(size_t i) const;
  // The healthy worker with the most free slots (ties: fewest of our sequences, then rotating).
  std::optional<size_t> Pick();
  // Mean of the healthy workers' reported median step time (0 before any report).
  double MeanStepSeconds() const;

 private:
  struct Worker {
    std::string address;
    bool healthy = false;
    int failures = 0;
    int total_slots = 0;
    int running_reported = 0;  // sequences the worker said it runs (all routers)
    int inflight = 0;          // sequences this router has on it
    bool refused = false;      // MarkFull: full until a sequence ends or a poll
    double step_p50_seconds = 0;
  };
  const int unhealthy_after_;
  std::vector<Worker> workers_;
  size_t rotate_ = 0;
};

}  // namespace tailserve
