#pragma once
// The router's single owner thread: queue, batching, dispatch, token relay, re-dispatch and worker
// health. gRPC threads only post commands here; nothing else touches this state.
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/clock.h"
#include "common/command_queue.h"
#include "common/config.h"
#include "common/server_stream.h"
#include "common/tokenizer.h"
#include "router/batcher.h"
#include "router/length_predictor.h"
#include "router/request.h"
#include "router/router_metrics.h"
#include "router/worker_client.h"
#include "router/prefix_index.h"
#include "router/session_map.h"
#include "router/worker_pool.h"

namespace tailserve {

using ClientSink = MessageSink<v1::GenerateResponse>;

// The first request key of a router process: a random 31-bit prefix above a counter. Keys go to
// workers as sequence ids, workers are shared by every router replica and know a sequence by its
// id alone, so two routers counting from 1 rejected ("already running") and cancelled each
// other's sequences.
uint64_t FirstSequenceKey();

// Why a dispatched sequence goes back to the queue.
enum class RequeueReason {
  kBudgetExhausted,  // the worker spent its step budget: the budget doubles
  kWorkerFailure,    // the worker failed, was lost or dropped it: bounded by router.max_failed_dispatches
  kRejected,         // the worker refused the batch (no free slot): nothing ran, so not a dispatch
};
// Its `reason` label on tailserve_router_redispatches_total: budget, worker_failure, rejected
// (the README, tests and bench/ladb_table.py match these).
const char* RequeueReasonLabel(RequeueReason reason);

class RouterCore {
 public:
  RouterCore(const Config& config, std::vector<std::string> worker_addresses,
             std::vector<std::unique_ptr<WorkerClient>> workers, std::unique_ptr<Batcher> batcher,
             std::unique_ptr<LengthPredictor> predictor, const Tokenizer& tokenizer, RouterMetrics& metrics,
             const Clock& clock = SystemClock::Get());
  ~RouterCore();

  void Start();
  // Fails every open request with UNAVAILABLE and joins the thread.
  void Stop();

  // A key for a new request, so its cancel callback can exist before Submit.
  uint64_t NewKey() { return next_key_.fetch_add(1); }
  // Queues the request (or finishes `sink` with RESOURCE_EXHAUSTED when the queue is full).
  void Submit(uint64_t key, ParsedRequest req, std::shared_ptr<ClientSink> sink, SteadyTime arrival);
  // The client went away (`deadline`: because its deadline passed). Unknown keys are ignored.
  void Cancel(uint64_t key, bool deadline);

  bool ready() const { return healthy_workers_.load() > 0; }
  // Called on the core thread whenever ready() flips. Set before Start().
  void OnReadinessChange(std::function<void(bool)> f) { on_readiness_ = std::move(f); }

 private:
  struct Request {
    ParsedRequest req;
    std::shared_ptr<ClientSink> sink;
    SteadyTime arrival;
    std::optional<SteadyTime> first_dispatch, first_token;
    std::vector<int32_t> generated;
    std::unique_ptr<StreamingDecoder> decoder;
    std::string held_text;  // decoded text held back while it could still start a stop string
    Prediction prediction;
    double remaining_steps = 0;  // what batching groups by: the prediction, then re-estimates
    int32_t step_budget = 0;
    int dispatches = 0;
    int failed_dispatches = 0;
    uint64_t batch = 0;  // the in-flight batch, 0 while queued
    bool simulated = false;
    int32_t cached_prompt_tokens = 0;  // of the prompt, found in the prefix cache for the first token
    // slo placement: the worker's predicted TTFT at dispatch, checked at the first token.
    double predicted_ttft = 0;
    SteadyTime dispatched_at{};
    size_t worker = 0;
  };
  struct InflightBatch {
    size_t worker = 0;
    std::unordered_set<uint64_t> open;  // sequences without a final event yet
    std::shared_ptr<ExecuteCall> call;
  };

  void Loop();
  void DoSubmit(uint64_t key, ParsedRequest req, std::shared_ptr<ClientSink> sink, SteadyTime arrival);
  void DoCancel(uint64_t key, bool deadline);
  void OnEvent(uint64_t batch_id, const v1::TokenEvent& ev);
  void OnBatchDone(uint64_t batch_id, const grpc::Status& status);
  void OnStatus(size_t worker, const absl::StatusOr<v1::WorkerStatus>& status);
  void PollWorkers();
  // Sends every batch the batcher forms at `now` while a worker has room; whether any went out.
  bool Dispatch(SteadyTime now);
  void WorkerDown(size_t worker);
  // Takes an ending request out of the queue, or cancels it on the worker running it.
  void Detach(uint64_t key, const Request& r);
  // Appends tokens and streams them; returns true when a stop string ended the request.
  bool Relay(Request& r, const v1::SequenceEvent& se);
  void Complete(uint64_t key, v1::FinishReason reason, const std::string& outcome);
  void Fail(uint64_t key, const grpc::Status& status, const std::string& outcome);
  void Requeue(uint64_t key, Request& r, RequeueReason reason);
  v1::Timings TimingsOf(const Request& r, SteadyTime now) const;
  void UpdateGauges();
  // batching.mode slo's early rejection: why no worker can take this request in time, or OK.
  absl::Status RejectEarly(const Request& r) const;
  // Counts the finished request against its objectives (tailserve_router_slo_*).
  void CountSlo(const Request& r, double ttft, double tpot);
  // Per worker, the mean predicted decode steps left of this router's sequences there (slo
  // placement's estimate of how soon a slot frees).
  std::vector<double> MeanRemainingSteps() const;
  void UpdatePrefixEventGauge();

  const Config config_;
  WorkerPool pool_;
  std::optional<PrefixIndex> prefix_index_;  // cache-aware placement (slo mode)
  SessionMap sessions_{65536};                // session affinity (slo mode)
  std::vector<std::unique_ptr<WorkerClient>> workers_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<LengthPredictor> predictor_;
  const Tokenizer& tokenizer_;
  RouterMetrics& metrics_;
  const Clock& clock_;

  CommandQueue commands_;
  std::thread thread_;
  std::atomic<uint64_t> next_key_{FirstSequenceKey()};
  std::atomic<int> healthy_workers_{0};
  std::function<void(bool)> on_readiness_;

  // Owned by the core thread.
  bool stopping_ = false;
  std::optional<std::vector<bool>> published_health_;  // what the worker gauges last showed
  std::unordered_map<uint64_t, Request> requests_;
  std::unordered_map<uint64_t, InflightBatch> batches_;
  uint64_t next_batch_ = 1;
  std::vector<bool> status_pending_;
  std::vector<v1::StatusRequest> kv_cursor_;  // per worker: its prefix-cache event cursor
  SteadyTime next_poll_;
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace tailserve
