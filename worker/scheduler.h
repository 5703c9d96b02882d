#pragma once
// The worker's slot scheduler: one thread owns the slots and drives the engine. Execute calls,
// cancellations and shutdown reach it as posted commands; it runs continuous batching (a finished
// sequence frees its slot at once, admitted sequences join the next step). With a waiting queue
// (SetPolicy's max_waiting) accepted sequences wait there for a slot and KV cache, are admitted
// in the policy's order, grow their KV on demand, and the policy's victim gives up its cache
// (and is recomputed later) when the cache runs out (scheduling_policy.h).
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/command_queue.h"
#include "common/server_stream.h"
#include "tailserve/v1/worker.pb.h"
#include "worker/engine/engine.h"
#include "worker/scheduling_policy.h"
#include "worker/step_cost_model.h"
#include "worker/worker_metrics.h"

namespace tailserve {

using BatchSink = MessageSink<v1::TokenEvent>;

struct SchedulerSnapshot {
  int total_slots = 0;
  int free_slots = 0;
  int running = 0;
  int waiting = 0;
  int max_waiting = 0;
  int64_t queued_prefill_tokens = 0;
  int prefilling = 0;
  int step_token_budget = 0;
  double step_p50_seconds = 0;
  double step_p95_seconds = 0;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, int slots, WorkerMetrics& metrics, const Clock& clock = SystemClock::Get());
  ~Scheduler();

  void Start();
  // Cancels every running sequence (its stream ends CANCELLED) and joins the thread.
  void Stop();

  // Without a waiting queue: admits the batch's valid sequences if they all fit free slots and
  // the KV cache, else finishes the sink with RESOURCE_EXHAUSTED without running anything. With
  // one: queues them if they fit the slots plus the queue, else RESOURCE_EXHAUSTED. An invalid sequence (or one longer
  // than the whole KV cache) is refused alone: a FINISH_STATE_INVALID event names why.
  void Submit(std::shared_ptr<BatchSink> sink, v1::Batch batch);
  // The stream behind `sink` is gone (client cancelled): drop its sequences.
  void CancelSink(std::shared_ptr<BatchSink> sink);
  // Cancels these sequences; `done(n)` is called with how many were running. An id not running
  // is remembered for kEarlyCancelTtl: Cancel and Execute are separate RPCs, so a router's cancel
  // can overtake the Execute that carries the sequence, which is then refused (CANCELLED) on
  // arrival instead of running unseen to its step budget.
  void Cancel(std::vector<uint64_t> ids, std::function<void(int)> done);
  static constexpr Duration kEarlyCancelTtl = std::chrono::seconds(60);
  static constexpr size_t kMaxEarlyCancels = 65536;

  SchedulerSnapshot Snapshot() const;

  // A failed engine step (a device fault: requests are validated before they reach the engine)
  // hands the running sequences back (their streams end UNAVAILABLE, as at shutdown, so a router
  // continues them on another worker), and from then on batches are turned away with UNAVAILABLE.
  // `handler` is called once, on the scheduler thread, before those streams end. Set it before
  // Start.
  void OnEngineFailure(std::function<void(const absl::Status&)> handler);
  // OK until an engine step fails, then that step's error (any thread).
  absl::Status EngineHealth() const;
  // The most new tokens one engine step computes (worker.step_token_budget): every decode, then
  // prefills in admission order, a prompt past the rest of the budget as a chunk. 0: every prompt
  // whole (the default). Set it before Start.
  void SetStepTokenBudget(int tokens) { policy_.step_token_budget = tokens; }
  // The learned step cost (scheduler thread only; tests read it after Stop).
  const StepCostModel& step_cost() const { return step_cost_; }
  // Admission order, KV reservation, preemption and step composition (its step_token_budget
  // replaces SetStepTokenBudget's),
  // and how many sequences may wait for a slot (0: none wait; a batch that does not fit now is
  // refused). Set before Start.
  void SetPolicy(const SchedulingPolicy& policy, int max_waiting);

 private:
  struct Slot {
    uint64_t id = 0;
    std::vector<int32_t> tokens;
    int32_t prompt_len = 0;
    int32_t max_tokens = 0;
    int32_t budget = 0;
    int32_t steps = 0;
    int32_t computed = 0;
    int32_t cached = 0;  // tokens its last admission found in the prefix cache
    int64_t reserved = 0;  // KV positions promised by the engine
    SteadyTime arrival{};  // of the request (at the router)
    SteadyTime queued{};   // entered the waiting queue (arrived or preempted)
    int priority = 1;
    double predicted_steps = 0;
    uint64_t admitted = 0;
    Duration ttft_slo{};
    Sampling sampling;
    std::unordered_set<int32_t> stop_ids;
    std::shared_ptr<BatchSink> sink;
  };

  void Loop();
  void Admit(std::shared_ptr<BatchSink> sink, v1::Batch batch);
  // Why this sequence cannot run here (`ids`: the ids running or admitted so far; adds its own).
  absl::Status ValidateSequence(const v1::Sequence& s, std::unordered_set<uint64_t>& ids) const;
  // Moves waiting sequences into free slots in the policy's order while the KV cache promises
  // them their admission reservation.
  void AdmitWaiting();
  // Reserves the KV a sequence is admitted with (AdmissionReservation), after attaching the cached
  // prefix its tokens begin with (counted as computed); on an error nothing stays attached.
  absl::Status ReserveForAdmission(Slot& s, int64_t want);
  // Grows each running sequence's KV promise to what this step computes plus the token it
  // samples; when the cache is short, preempts the policy's victim (it waits to be recomputed).
  void EnsureKv();
  void Preempt(size_t index);
  WorkItem ItemOf(const Slot& s) const;
  void RunStep();
  // Removes the slot and, when its sink has no sequences left, finishes the sink.
  void Retire(size_t index, const char* reason);
  void RetireWaiting(size_t index, const char* reason);
  void Finished(Slot slot, const char* reason);
  // What is queued for a first token, as events and Status report it: sequences waiting for a
  // slot, running sequences whose prompt is not all in the cache yet, and the prompt tokens of
  // both not yet prefilled (decodes' one excluded). One pass over the sequences.
  struct QueueLoad {
    int waiting = 0;
    int prefilling = 0;
    int64_t prefill_tokens = 0;
  };
  QueueLoad CurrentLoad() const;
  // Load fields every event carries.
  void SetLoad(v1::TokenEvent& ev, int free_slots, const QueueLoad& load) const;
  void SetLoad(v1::TokenEvent& ev, int free_slots) const { SetLoad(ev, free_slots, CurrentLoad()); }
  // Ends every running sequence's stream with `status` (UNAVAILABLE: a router runs them elsewhere).
  void HandBackAll(const grpc::Status& status, const char* reason);
  // Slot counts (cheap) / counts plus step-time quantiles (sorts the window).
  void PublishCounts();
  void PublishSnapshot();
  // Remembers an id cancelled before it arrived (bounded: expired ids go first, then the oldest).
  void RememberEarlyCancel(uint64_t id);

  Engine& engine_;
  const std::vector<int32_t> eos_ids_;  // the model's EOS ids end every sequence
  const int slots_;
  SchedulingPolicy policy_;
  int max_waiting_ = 0;
  StepCostModel step_cost_;
  WorkerMetrics& metrics_;
  const Clock& clock_;
  CommandQueue commands_;
  std::thread thread_;
  bool stopping_ = false;
  std::function<void(const absl::Status&)> on_engine_failure_;

  // Owned by the scheduler thread.
  std::vector<Slot> running_;
  std::vector<Slot> waiting_;
  uint64_t admissions_ = 0;
  std::unordered_map<BatchSink*, int> open_per_sink_;
  std::unordered_map<uint64_t, SteadyTime> early_cancels_;  // id → when it was cancelled
  std::deque<std::pair<uint64_t, SteadyTime>> early_order_;  // the same, oldest first (may hold used ids)

  mutable std::mutex snapshot_mu_;
  SchedulerSnapshot snapshot_;
  absl::Status engine_failure_;  // guarded by snapshot_mu_
};

}  // namespace tailserve
