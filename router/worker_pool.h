#pragma once
// What the router knows about its workers: health (from Status polls and stream failures), free
// capacity (slots plus waiting queue) and load, and from it each worker's predicted time to a new
// request's first token. Owned by the core thread; no locking.
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
  // Free slots and the waiting queue as reported in a TokenEvent (fresher than the last poll);
  // `ended`: the event ends at least one sequence.
  void OnEventLoad(size_t i, const v1::TokenEvent& ev, bool ended);

  void AddInflight(size_t i, int delta) { workers_[i].inflight += delta; }
  // A prompt just sent to worker i waits there until its next report says otherwise.
  void AddQueuedPrompt(size_t i, int64_t tokens) { workers_[i].queued_prefill_tokens += tokens; }
  int inflight(size_t i) const { return workers_[i].inflight; }
  // Sequences a new batch may add to worker i: free slots plus free places in its waiting queue
  // (0 when unhealthy).
  int Free(size_t i) const;
  // The healthy worker with the most free capacity (ties: fewest of our sequences, then rotating).
  std::optional<size_t> Pick();
  // Predicted seconds from dispatch to the first token of a `prompt_tokens` prompt on worker i:
  // the steps to prefill what waits ahead of it and itself under the worker's step-token budget,
  // plus, when its slots are full, a share of the steps until one frees (`remaining_steps`: the
  // mean predicted steps left of what runs there), at its median step time, times the pool's
  // learned correction (ObserveTtft).
  double PredictTtftSeconds(size_t i, int64_t prompt_tokens, double remaining_steps) const;
  // The worker with room and the least predicted TTFT (within half a step or 5%, the one holding
  // more of the prompt in its cache, then the least loaded:
  // predictions of one step or two tie often, and the load breaks the tie), with that prediction; nullopt
  // when none has room. `remaining_steps[i]` as above. BestTtft only looks; PickByTtft also moves
  // the rotation past the pick, as Pick does.
  struct TtftPick {
    size_t worker;
    double ttft_seconds;
  };
  // `cached[i]` (when given): the prompt's leading tokens worker i holds in its prefix cache,
  // which it does not prefill (PrefixIndex::Overlap).
  std::optional<TtftPick> BestTtft(int64_t prompt_tokens, const std::vector<double>& remaining_steps,
                                   const std::vector<int64_t>* cached = nullptr) const;
  std::optional<TtftPick> PickByTtft(int64_t prompt_tokens, const std::vector<double>& remaining_steps,
                                     const std::vector<int64_t>* cached = nullptr);
  // A first token came `actual` seconds after dispatch where `predicted` was predicted: the
  // correction moves toward their ratio (an exponential average), so the prediction learns what
  // the load fields miss (prompt cost, step time under load). One for the pool: a correction per
  // worker let the one that happened to learn the lowest draw every request until it was
  // overloaded (herding); differences between workers come in through their own step times.
  void ObserveTtft(double predicted, double actual);
  double ttft_correction() const { return ttft_correction_; }
  // Requests queued on worker i for their first token: waiting for a slot, or holding one while
  // their prompt is prefilled in chunks; as last reported (or assumed full after a refusal).
  int queued(size_t i) const { return workers_[i].waiting_reported + workers_[i].prefilling_reported; }
  // Balance for the TTFT placements: a worker whose sequences, with one more, would exceed
  // `factor` times the healthy workers' mean (with it) plus one is overloaded and passed over
  // while another has room (router.max_load_imbalance; 0: off). A prefix cached on one worker
  // makes it look fastest to every request that shares it; this keeps a hot prefix from pinning
  // the traffic there (SGLang's cache-aware router balances the same way).
  void set_max_load_imbalance(double factor) { max_imbalance_ = factor; }
  bool Overloaded(size_t i) const;
  // Mean of the healthy workers' reported median step time (0 before any report).
  double MeanStepSeconds() const;
  // Worker i's median step time as the predictions use it: its report, else the pool's mean, else
  // a nominal 10 ms.
  double StepSeconds(size_t i) const;

 private:
  // Sequences on worker i, running or waiting: what it reported, or our own dispatches if more.
  int Load(size_t i) const;

  struct Worker {
    std::string address;
    bool healthy = false;
    int failures = 0;
    int total_slots = 0;
    int running_reported = 0;  // sequences the worker said it runs (all routers)
    int waiting_reported = 0;  // and holds in its waiting queue
    int prefilling_reported = 0;  // running, prompt not all prefilled yet
    int max_waiting = 0;
    int64_t queued_prefill_tokens = 0;
    int step_token_budget = 0;
    int inflight = 0;          // sequences this router has on it
    bool refused = false;      // MarkFull: full until a sequence ends or a poll
    double step_p50_seconds = 0;
  };
  const int unhealthy_after_;
  double max_imbalance_ = 0;
  std::vector<Worker> workers_;
  size_t rotate_ = 0;
  double ttft_correction_ = 1;
};

}  // namespace tailserve
