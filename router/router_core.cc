#include "router/router_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"

namespace tailserve {
namespace {

// The `class` label of the SLO metrics.
const char* PriorityClass(v1::Priority p) {
  return p == v1::PRIORITY_INTERACTIVE ? "interactive" : p == v1::PRIORITY_BATCH ? "batch" : "standard";
}

}  // namespace

uint64_t FirstSequenceKey() {
  std::random_device rd;
  uint64_t prefix = uint64_t{rd()} & 0x7fffffffu;  // below the worker's warm-up id (~0)
  if (prefix == 0) prefix = 1;
  return prefix << 32 | 1u;
}

const char* RequeueReasonLabel(RequeueReason reason) {
  switch (reason) {
    case RequeueReason::kBudgetExhausted: return "budget";
    case RequeueReason::kWorkerFailure: return "worker_failure";
    case RequeueReason::kRejected: return "rejected";
  }
  return "unknown";
}

RouterCore::RouterCore(const Config& config, std::vector<std::string> worker_addresses,
                       std::vector<std::unique_ptr<WorkerClient>> workers, std::unique_ptr<Batcher> batcher,
                       std::unique_ptr<LengthPredictor> predictor, const Tokenizer& tokenizer, RouterMetrics& metrics,
                       const Clock& clock)
    : config_(config),
      pool_(std::move(worker_addresses), config.router.unhealthy_after_failures),
      workers_(std::move(workers)),
      batcher_(std::move(batcher)),
      predictor_(std::move(predictor)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      clock_(clock),
      status_pending_(workers_.size(), false),
      kv_cursor_(workers_.size()) {
  pool_.set_max_load_imbalance(config_.router.max_load_imbalance);
  if (config_.batching.mode == "slo" && config_.router.cache_aware_routing) {
    // A placement counts until the worker's events have had two polls to show its blocks.
    prefix_index_.emplace(workers_.size(), static_cast<size_t>(config_.router.prefix_index_blocks),
                          2 * std::chrono::milliseconds(config_.router.health_check_interval_ms));
  }
  UpdateGauges();
}

RouterCore::~RouterCore() { Stop(); }

void RouterCore::Start() { thread_ = std::thread([this] { Loop(); }); }

void RouterCore::Stop() {
  if (!thread_.joinable()) return;
  commands_.Post([this] { stopping_ = true; });
  thread_.join();
  // Requests that raced with the stop, or come after it (the gRPC server still accepts calls
  // until it shuts down), are refused (UNAVAILABLE) rather than left hanging.
  commands_.Close();
}

void RouterCore::Submit(uint64_t key, ParsedRequest req, std::shared_ptr<ClientSink> sink, SteadyTime arrival) {
  commands_.Post([this, key, req = std::move(req), sink = std::move(sink), arrival]() mutable {
    DoSubmit(key, std::move(req), std::move(sink), arrival);
  });
}

void RouterCore::Cancel(uint64_t key, bool deadline) {
  commands_.Post([this, key, deadline] { DoCancel(key, deadline); });
}

void RouterCore::DoSubmit(uint64_t key, ParsedRequest req, std::shared_ptr<ClientSink> sink, SteadyTime arrival) {
  if (stopping_) {
    metrics_.requests.Labels({"unavailable"}).Inc();
    sink->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "router is shutting down"));
    return;
  }
  if (batcher_->size() >= static_cast<size_t>(config_.router.max_queue_size)) {
    metrics_.requests.Labels({"resource_exhausted"}).Inc();
    sink->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              absl::StrCat("queue full: ", batcher_->size(), " requests waiting (router.max_queue_size)")));
    return;
  }
  // A fixed seed makes a re-dispatched sequence continue with the same randomness.
  if (!req.sampling.has_seed()) req.sampling.set_seed(rng_());
  Request r;
  r.prediction = predictor_->Predict(req);
  r.remaining_steps = r.prediction.steps;
  // fcfs and slo dispatch at once to worker queues and never hand work back early: no step budget
  // (slo's worker re-estimates what outlives its prediction instead).
  r.step_budget = config_.batching.mode == "ladb" || config_.batching.mode == "fifo"
                      ? InitialStepBudget(config_.predictor, r.prediction.steps)
                      : 0;
  r.req = std::move(req);
  // Objectives the request did not set come from its class's defaults.
  const RouterConfig& rc = config_.router;
  const bool interactive = r.req.priority == v1::PRIORITY_INTERACTIVE, batch = r.req.priority == v1::PRIORITY_BATCH;
  if (r.req.ttft_slo_ms == 0) {
    r.req.ttft_slo_ms = interactive ? rc.interactive_ttft_slo_ms : batch ? rc.batch_ttft_slo_ms : rc.standard_ttft_slo_ms;
  }
  if (r.req.tpot_slo_ms == 0) {
    r.req.tpot_slo_ms = interactive ? rc.interactive_tpot_slo_ms : batch ? rc.batch_tpot_slo_ms : rc.standard_tpot_slo_ms;
  }
  if (absl::Status why = RejectEarly(r); !why.ok()) {
    metrics_.requests.Labels({"resource_exhausted"}).Inc();
    metrics_.slo_rejections.Labels({PriorityClass(r.req.priority)}).Inc();
    sink->Finish(ToGrpcStatus(why));
    return;
  }
  r.sink = std::move(sink);
  r.arrival = arrival;
  r.decoder = std::make_unique<StreamingDecoder>(tokenizer_);
  batcher_->Push({key, r.req.priority, r.remaining_steps, arrival}, false);
  requests_.emplace(key, std::move(r));
}

void RouterCore::DoCancel(uint64_t key, bool deadline) {
  auto it = requests_.find(key);
  if (it == requests_.end()) return;
  Request& r = it->second;
  Detach(key, r);
  metrics_.requests.Labels({deadline ? "deadline_exceeded" : "cancelled"}).Inc();
  r.sink->Finish(deadline ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded")
                          : grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  requests_.erase(it);
}

void RouterCore::Detach(uint64_t key, const Request& r) {
  if (r.batch == 0) {
    batcher_->Remove(key);
  } else if (auto b = batches_.find(r.batch); b != batches_.end()) {
    workers_[b->second.worker]->Cancel({key});
  }
}

bool RouterCore::Relay(Request& r, const v1::SequenceEvent& se) {
  if (se.token_ids().empty()) return false;
  const SteadyTime now = clock_.Now();
  v1::GenerateResponse resp;
  resp.set_request_id(r.req.request_id);
  std::string text;
  for (int i = 0; i < se.token_ids_size(); ++i) {
    const int32_t t = se.token_ids(i);
    r.generated.push_back(t);
    resp.add_token_ids(t);
    const bool stop_token = se.state() == v1::FINISH_STATE_STOP && i + 1 == se.token_ids_size() &&
                            std::count(r.req.stop_token_ids.begin(), r.req.stop_token_ids.end(), t) > 0;
    if (!stop_token) text += r.decoder->Add(t);
  }
  if (r.req.sampling.logprobs()) *resp.mutable_logprobs() = se.logprobs();
  if (!r.first_token) {
    r.first_token = now;
    r.cached_prompt_tokens = std::min<int32_t>(se.cached_tokens(), static_cast<int32_t>(r.req.prompt.size()));
    if (r.predicted_ttft > 0) {
      const double actual = Seconds(now - r.dispatched_at);
      pool_.ObserveTtft(r.predicted_ttft, actual);
      metrics_.ttft_prediction_abs_error.Observe(std::abs(actual - r.predicted_ttft));
    }
  }
  metrics_.output_tokens.Inc(se.token_ids_size());

  // Hold back any tail that could still grow into a stop string, so it is never streamed.
  r.held_text += text;
  bool stopped = false;
  std::string emit;
  size_t hit = std::string::npos, longest = 0;
  for (const std::string& s : r.req.stop) {
    hit = std::min(hit, r.held_text.find(s));
    longest = std::max(longest, s.size());
  }
  if (hit != std::string::npos) {
    emit = r.held_text.substr(0, hit);
    r.held_text.clear();
    stopped = true;
  } else {
    size_t cut = r.held_text.size() > longest ? r.held_text.size() - (longest ? longest - 1 : 0) : 0;
    while (cut > 0 && cut < r.held_text.size() && (static_cast<unsigned char>(r.held_text[cut]) & 0xC0) == 0x80) --cut;
    emit = r.held_text.substr(0, cut);
    r.held_text.erase(0, cut);
  }
  resp.set_text(std::move(emit));
  resp.set_simulated(r.simulated);
  r.sink->Write(std::move(resp));
  return stopped;
}

v1::Timings RouterCore::TimingsOf(const Request& r, SteadyTime now) const {
  v1::Timings t;
  if (r.first_dispatch) t.set_queue_seconds(Seconds(*r.first_dispatch - r.arrival));
  if (r.first_token) t.set_ttft_seconds(Seconds(*r.first_token - r.arrival));
  t.set_total_seconds(Seconds(now - r.arrival));
  t.set_dispatches(r.dispatches);
  return t;
}

void RouterCore::Complete(uint64_t key, v1::FinishReason reason, const std::string& outcome) {
  auto it = requests_.find(key);
  Request& r = it->second;
  const SteadyTime now = clock_.Now();
  v1::GenerateResponse resp;
  resp.set_request_id(r.req.request_id);
  resp.set_text(r.held_text + r.decoder->Flush());
  resp.set_finish_reason(reason);
  resp.mutable_usage()->set_prompt_tokens(static_cast<int32_t>(r.req.prompt.size()));
  resp.mutable_usage()->set_completion_tokens(static_cast<int32_t>(r.generated.size()));
  resp.mutable_usage()->set_cached_prompt_tokens(r.cached_prompt_tokens);
  *resp.mutable_timings() = TimingsOf(r, now);
  resp.set_simulated(r.simulated);
  predictor_->Feedback(r.prediction, static_cast<int64_t>(r.generated.size()));
  // Metrics first: a client that sees its stream end and then scrapes finds its request counted.
  metrics_.requests.Labels({outcome}).Inc();
  const double total = Seconds(now - r.arrival);
  metrics_.e2e.Observe(total);
  metrics_.e2e_window.Observe(total);
  if (r.first_token) {
    const double ttft = Seconds(*r.first_token - r.arrival);
    metrics_.ttft.Observe(ttft);
    metrics_.ttft_window.Observe(ttft);
    double tpot = 0;
    if (r.generated.size() > 1) {
      tpot = (total - ttft) / static_cast<double>(r.generated.size() - 1);
      metrics_.tpot.Observe(tpot);
      metrics_.tpot_window.Observe(tpot);
    }
    CountSlo(r, ttft, tpot);
  }
  r.sink->Write(std::move(resp));
  r.sink->Finish(grpc::Status::OK);
  requests_.erase(it);
}

void RouterCore::Fail(uint64_t key, const grpc::Status& status, const std::string& outcome) {
  auto it = requests_.find(key);
  if (it == requests_.end()) return;
  Detach(key, it->second);
  metrics_.requests.Labels({outcome}).Inc();
  it->second.sink->Finish(status);
  requests_.erase(it);
}

void RouterCore::Requeue(uint64_t key, Request& r, RequeueReason reason) {
  r.batch = 0;
  if (reason == RequeueReason::kRejected) --r.dispatches;  // nothing ran
  // Budget overruns always make progress (the budget doubles); failures are bounded.
  if (reason == RequeueReason::kWorkerFailure && ++r.failed_dispatches >= config_.router.max_failed_dispatches) {
    Fail(key, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat("gave up after ", r.failed_dispatches, " failed dispatches")),
         "unavailable");
    return;
  }
  if (reason == RequeueReason::kBudgetExhausted) {
    // Mispredicted long: at least another doubled budget to go, so it now groups with long work.
    r.step_budget = static_cast<int32_t>(std::min<int64_t>(int64_t{r.step_budget} * 2, 1'000'000'000));
    r.remaining_steps = std::min<double>(r.step_budget, r.req.max_tokens - static_cast<double>(r.generated.size()));
  }
  metrics_.redispatches.Labels({RequeueReasonLabel(reason)}).Inc();
  batcher_->Push({key, r.req.priority, r.remaining_steps, r.arrival}, true);
}

void RouterCore::OnEvent(uint64_t batch_id, const v1::TokenEvent& ev) {
  auto bit = batches_.find(batch_id);
  if (bit == batches_.end()) return;
  InflightBatch& b = bit->second;
  const bool ended = std::any_of(ev.sequences().begin(), ev.sequences().end(),
                                 [](const v1::SequenceEvent& se) { return se.state() != v1::FINISH_STATE_RUNNING; });
  pool_.OnEventLoad(b.worker, ev, ended);
  for (const v1::SequenceEvent& se : ev.sequences()) {
    const uint64_t id = se.sequence_id();
    if (!b.open.count(id)) continue;
    const bool final = se.state() != v1::FINISH_STATE_RUNNING;
    if (final) {
      b.open.erase(id);
      pool_.AddInflight(b.worker, -1);
    }
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.batch != batch_id) continue;  // cancelled meanwhile
    Request& r = it->second;
    r.simulated = ev.simulated();
    if (Relay(r, se)) {
      if (!final) workers_[b.worker]->Cancel({id});
      Complete(id, v1::FINISH_REASON_STOP, "stop");
      continue;
    }
    switch (se.state()) {
      case v1::FINISH_STATE_RUNNING:
        break;
      case v1::FINISH_STATE_STOP:
        Complete(id, v1::FINISH_REASON_STOP, "stop");
        break;
      case v1::FINISH_STATE_LENGTH:
        Complete(id, v1::FINISH_REASON_LENGTH, "length");
        break;
      case v1::FINISH_STATE_BUDGET_EXHAUSTED:
        Requeue(id, r, RequeueReason::kBudgetExhausted);
        break;
      case v1::FINISH_STATE_CANCELLED:  // the worker dropped it (e.g. shutting down): run it elsewhere
        Requeue(id, r, RequeueReason::kWorkerFailure);
        break;
      case v1::FINISH_STATE_INVALID:  // the worker refused it alone: no worker of this kind runs it
        r.batch = 0;  // never admitted there: nothing to cancel on the worker
        Fail(id, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, se.error()), "invalid_argument");
        break;
      default:
        r.batch = 0;  // it ended there: nothing to cancel on the worker
        Fail(id, grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("worker error: ", se.error())), "error");
        break;
    }
  }
}

void RouterCore::OnBatchDone(uint64_t batch_id, const grpc::Status& status) {
  auto bit = batches_.find(batch_id);
  if (bit == batches_.end()) return;
  InflightBatch b = std::move(bit->second);
  batches_.erase(bit);
  const auto code = status.error_code();
  for (uint64_t id : b.open) {
    pool_.AddInflight(b.worker, -1);
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.batch != batch_id) continue;
    if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      Requeue(id, it->second, RequeueReason::kRejected);
    } else if (code == grpc::StatusCode::INVALID_ARGUMENT) {
      Fail(id, status, "invalid_argument");
    } else {
      Requeue(id, it->second, RequeueReason::kWorkerFailure);
    }
  }
  if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    pool_.MarkFull(b.worker);
  } else if (!status.ok() && code != grpc::StatusCode::INVALID_ARGUMENT && code != grpc::StatusCode::CANCELLED) {
    spdlog::warn("worker {} stream failed: {} ({})", pool_.address(b.worker), status.error_message(),
                 static_cast<int>(code));
    WorkerDown(b.worker);
  }
}

void RouterCore::WorkerDown(size_t worker) {
  if (pool_.MarkDown(worker)) spdlog::warn("worker {} out of rotation", pool_.address(worker));
  // What it cached may be gone (a restart): learn it again from a snapshot.
  if (prefix_index_) prefix_index_->Forget(worker);
  kv_cursor_[worker].Clear();
  UpdatePrefixEventGauge();
  // Streams to a worker out of rotation may hang (a stopped process keeps its sockets): cancel them
  // so their sequences are re-dispatched now.
  for (auto& [id, b] : batches_) {
    if (b.worker == worker && b.call) b.call->Cancel();
  }
}

void RouterCore::UpdatePrefixEventGauge() {
  int n = 0;
  for (size_t w = 0; prefix_index_ && w < workers_.size(); ++w) n += prefix_index_->exact(w);
  metrics_.prefix_event_workers.Set(n);
}

void RouterCore::OnStatus(size_t worker, const absl::StatusOr<v1::WorkerStatus>& status) {
  status_pending_[worker] = false;
  if (status.ok() && status->has_kv_events() && prefix_index_ && config_.router.prefix_cache_events) {
    const v1::KvCacheEvents& ev = status->kv_events();
    if (ev.block_size() == PrefixIndex::kBlockTokens) {
      prefix_index_->ApplyEvents(worker, ev.salt(), ev.snapshot(),
                                 std::span<const uint64_t>(ev.stored().data(), ev.stored().size()),
                                 std::span<const uint64_t>(ev.removed().data(), ev.removed().size()));
      kv_cursor_[worker].set_kv_events_since(ev.next());
      kv_cursor_[worker].set_kv_events_epoch(ev.epoch());
      UpdatePrefixEventGauge();
    }
  }
  if (!pool_.OnStatus(worker, status)) return;
  if (pool_.healthy(worker)) {
    spdlog::info("worker {} in rotation ({} slots)", pool_.address(worker), status->total_slots());
  } else {
    spdlog::warn("worker {} failed health checks: {}", pool_.address(worker),
                 status.ok() ? std::string("not ready") : std::string(status.status().message()));
    WorkerDown(worker);
  }
}

void RouterCore::PollWorkers() {
  const SteadyTime now = clock_.Now();
  if (now < next_poll_) return;
  next_poll_ = now + std::chrono::milliseconds(config_.router.health_check_interval_ms);
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (status_pending_[w]) continue;
    status_pending_[w] = true;
    workers_[w]->Status(std::chrono::milliseconds(config_.router.health_check_timeout_ms), kv_cursor_[w],
                        [this, w](absl::StatusOr<v1::WorkerStatus> s) {
                          commands_.Post([this, w, s = std::move(s)] { OnStatus(w, s); });
                        });
  }
}

absl::Status RouterCore::RejectEarly(const Request& r) const {
  const int depth = config_.router.slo_reject_waiting;
  if (config_.batching.mode != "slo" || depth <= 0) return absl::OkStatus();
  const int64_t prompt = static_cast<int64_t>(r.req.prompt.size());
  // The worker placement would pick; none with room: the router's own queue
  // (router.max_queue_size) takes it.
  std::vector<int64_t> cached;
  if (prefix_index_) cached = prefix_index_->Overlap(PrefixIndex::Hash(r.req.prompt), clock_.Now());
  const std::optional<WorkerPool::TtftPick> best =
      pool_.BestTtft(prompt, MeanRemainingSteps(), prefix_index_ ? &cached : nullptr);
  if (!best || pool_.queued(best->worker) < depth) return absl::OkStatus();
  const double slo = r.req.ttft_slo_ms * 1e-3;
  const bool batch = r.req.priority == v1::PRIORITY_BATCH;
  if (!batch && (slo <= 0 || best->ttft_seconds <= slo)) return absl::OkStatus();
  // The hint: about when the best worker's queue has drained to where the objective holds.
  const double retry_after = std::max(0.1, best->ttft_seconds - slo);
  const int queued = pool_.queued(best->worker);
  return absl::ResourceExhaustedError(
      batch ? absl::StrCat("workers are loaded (", queued, " queued): batch-priority work is refused first; retry after ",
                           absl::StrFormat("%.1f", retry_after), " s")
            : absl::StrCat("no worker can meet ttft_slo_ms ", r.req.ttft_slo_ms, " (predicted ",
                           static_cast<int>(best->ttft_seconds * 1000), " ms with ", queued, " queued); retry after ",
                           absl::StrFormat("%.1f", retry_after), " s"));
}

void RouterCore::CountSlo(const Request& r, double ttft, double tpot) {
  const bool has_ttft = r.req.ttft_slo_ms > 0, has_tpot = r.req.tpot_slo_ms > 0;
  if (!has_ttft && !has_tpot) return;
  const char* cls = PriorityClass(r.req.priority);
  metrics_.slo_requests.Labels({cls}).Inc();
  const bool ttft_met = !has_ttft || ttft <= r.req.ttft_slo_ms * 1e-3;
  const bool tpot_met = !has_tpot || tpot <= r.req.tpot_slo_ms * 1e-3;
  if (has_ttft && ttft_met) metrics_.slo_attained.Labels({cls, "ttft"}).Inc();
  if (has_tpot && tpot_met) metrics_.slo_attained.Labels({cls, "tpot"}).Inc();
  if (ttft_met && tpot_met) metrics_.slo_attained.Labels({cls, "both"}).Inc();
}

std::vector<double> RouterCore::MeanRemainingSteps() const {
  std::vector<double> sum(pool_.size(), 0.0), n(pool_.size(), 0.0);
  for (const auto& [key, r] : requests_) {
    if (r.batch == 0) continue;
    sum[r.worker] += std::max(1.0, r.prediction.steps - static_cast<double>(r.generated.size()));
    n[r.worker] += 1;
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = n[i] > 0 ? sum[i] / n[i] : 0;
  return sum;
}

bool RouterCore::Dispatch(SteadyTime now) {
  const bool slo = config_.batching.mode == "slo";
  std::vector<double> remaining;
  for (bool any = false;; any = true) {
    std::optional<size_t> w = pool_.Pick();
    if (!w) return any;
    BatchReason reason;
    const std::vector<uint64_t> ids = batcher_->Next(now, static_cast<size_t>(pool_.Free(*w)), &reason);
    if (ids.empty()) return any;
    double predicted_ttft = 0;
    if (slo) {
      // Placement by predicted latency: the worker where this request's first token comes soonest.
      if (remaining.empty()) remaining = MeanRemainingSteps();
      const Request& r = requests_.at(ids.front());
      const int64_t prompt = static_cast<int64_t>(r.req.prompt.size() + r.generated.size());
      // Cache-aware: each worker's prediction counts only what its prefix cache lacks.
      PrefixIndex::Blocks blocks;
      std::vector<int64_t> cached;
      std::vector<int32_t> redispatched;  // a re-dispatch: the prompt and what it generated so far
      if (prefix_index_) {
        if (r.generated.empty()) {
          blocks = PrefixIndex::Hash(r.req.prompt);
        } else {
          redispatched = r.req.prompt;
          redispatched.insert(redispatched.end(), r.generated.begin(), r.generated.end());
          blocks = PrefixIndex::Hash(redispatched);
        }
        cached = prefix_index_->Overlap(blocks, now);
      }
      // Pick found room, so this finds a worker too.
      if (const std::optional<WorkerPool::TtftPick> pick =
              pool_.PickByTtft(prompt, remaining, prefix_index_ ? &cached : nullptr)) {
        w = pick->worker;
        predicted_ttft = pick->ttft_seconds;
      }
      // Session affinity: no worker is known to hold this prompt, but its session's last request
      // went to one, whose cache likely holds the conversation.
      const bool known = prefix_index_ && std::any_of(cached.begin(), cached.end(), [](int64_t c) { return c > 0; });
      if (config_.router.session_affinity && !r.req.session_id.empty() && !known) {
        if (const std::optional<size_t> s = sessions_.Worker(r.req.session_id);
            s && *s != *w && pool_.Free(*s) > 0 && !pool_.Overloaded(*s)) {
          const double t = pool_.PredictTtftSeconds(*s, prompt, *s < remaining.size() ? remaining[*s] : 0);
          if (t <= predicted_ttft + pool_.ttft_correction() * pool_.StepSeconds(*s)) {
            w = *s;
            predicted_ttft = t;
            metrics_.session_affinity_placements.Inc();
          }
        }
      }
      if (!r.req.session_id.empty()) sessions_.Record(r.req.session_id, *w);
      pool_.AddQueuedPrompt(*w, prompt - (prefix_index_ ? cached[*w] : 0));
      if (prefix_index_) prefix_index_->Record(*w, blocks, now);
    }
    const uint64_t batch_id = next_batch_++;
    v1::Batch batch;
    batch.set_batch_id(absl::StrCat(batch_id));
    InflightBatch inflight{*w, {}, nullptr};
    double sum = 0, sum_sq = 0;
    for (uint64_t id : ids) {
      Request& r = requests_.at(id);
      sum += r.remaining_steps;
      sum_sq += r.remaining_steps * r.remaining_steps;
      v1::Sequence* s = batch.add_sequences();
      s->set_sequence_id(id);
      s->mutable_prompt_token_ids()->Add(r.req.prompt.begin(), r.req.prompt.end());
      s->mutable_generated_token_ids()->Add(r.generated.begin(), r.generated.end());
      s->set_max_tokens(r.req.max_tokens);
      s->set_step_budget(r.step_budget);
      // The honest fcfs baseline uses no prediction anywhere.
      if (config_.batching.mode != "fcfs") s->set_predicted_steps(r.remaining_steps);
      s->set_priority(r.req.priority);
      s->set_waited_ms(std::chrono::duration_cast<std::chrono::milliseconds>(now - r.arrival).count());
      s->set_ttft_slo_ms(r.req.ttft_slo_ms);
      r.worker = *w;
      r.dispatched_at = now;
      r.predicted_ttft = r.first_token ? 0 : predicted_ttft;
      *s->mutable_sampling() = r.req.sampling;
      s->mutable_stop_token_ids()->Add(r.req.stop_token_ids.begin(), r.req.stop_token_ids.end());
      r.batch = batch_id;
      ++r.dispatches;
      if (!r.first_dispatch) {
        r.first_dispatch = now;
        const double q = Seconds(now - r.arrival);
        metrics_.queue_time.Observe(q);
        metrics_.queue_time_window.Observe(q);
      }
      inflight.open.insert(id);
    }
    const int n = static_cast<int>(ids.size());
    const double mean = sum / n;
    metrics_.batch_prediction_cv.Observe(mean > 0 ? std::sqrt(std::max(0.0, sum_sq / n - mean * mean)) / mean : 0);
    pool_.AddInflight(*w, n);
    metrics_.batch_size.Observe(n);
    metrics_.batch_efficiency.Observe(static_cast<double>(n) / config_.batching.max_batch_size);
    metrics_.batches.Labels({BatchReasonName(reason)}).Inc();
    InflightBatch& ref = batches_[batch_id] = std::move(inflight);
    ref.call = workers_[*w]->Execute(
        std::move(batch),
        [this, batch_id](v1::TokenEvent ev) {
          commands_.Post([this, batch_id, ev = std::move(ev)] { OnEvent(batch_id, ev); });
        },
        [this, batch_id](grpc::Status s) { commands_.Post([this, batch_id, s] { OnBatchDone(batch_id, s); }); });
  }
}

void RouterCore::UpdateGauges() {
  metrics_.queue_length.Set(static_cast<double>(batcher_->size()));
  metrics_.inflight.Set(static_cast<double>(requests_.size()));
  std::vector<bool> health(pool_.size());
  for (size_t w = 0; w < pool_.size(); ++w) health[w] = pool_.healthy(w);
  if (published_health_ && *published_health_ == health) return;
  published_health_ = health;
  const size_t healthy = pool_.healthy_count();
  const int was = healthy_workers_.exchange(static_cast<int>(healthy));
  // Per-worker gauges before the total, so a reader that waits on the total sees them current.
  // (Label lookups take a lock: only when the health picture changed, not every loop turn.)
  for (size_t w = 0; w < pool_.size(); ++w) metrics_.worker_up.Labels({pool_.address(w)}).Set(health[w] ? 1 : 0);
  metrics_.workers_healthy.Set(static_cast<double>(healthy));
  if (on_readiness_ && (was > 0) != (healthy > 0)) on_readiness_(healthy > 0);
}

void RouterCore::Loop() {
  next_poll_ = clock_.Now();
  bool dispatched = true;
  SteadyTime dispatched_at = next_poll_;
  while (!stopping_) {
    std::optional<SteadyTime> wake = std::min(next_poll_, predictor_->next_tick());
    // A deadline the last Dispatch already saw as due, and could not serve, waits for room, which
    // comes as a command (a step event, a batch's end, a poll): waking for it again would spin a
    // core whenever every worker is full.
    if (auto d = batcher_->NextDeadline(); d && (dispatched || *d > dispatched_at)) wake = std::min(*wake, *d);
    for (auto& c : commands_.TakeAll(wake)) c();
    if (stopping_) break;
    predictor_->Tick();
    // Drift: predictions are not trusted, so batch by arrival until the predictor recovers.
    batcher_->SetLengthAware(config_.batching.mode == "ladb" && !predictor_->drift_active());
    batcher_->SetStepSeconds(pool_.MeanStepSeconds());
    PollWorkers();
    dispatched_at = clock_.Now();
    dispatched = Dispatch(dispatched_at);
    UpdateGauges();
  }
  // Shutdown: fail what is open, cancel worker streams, and wait (bounded) for their callbacks so
  // none outlives this object.
  std::vector<uint64_t> keys;
  for (auto& [k, r] : requests_) keys.push_back(k);
  for (uint64_t k : keys) Fail(k, grpc::Status(grpc::StatusCode::UNAVAILABLE, "router is shutting down"), "unavailable");
  for (auto& [id, b] : batches_) {
    if (b.call) b.call->Cancel();
  }
  const SteadyTime give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto pending = [&] {
    return !batches_.empty() || std::any_of(status_pending_.begin(), status_pending_.end(), [](bool p) { return p; });
  };
  while (pending() && std::chrono::steady_clock::now() < give_up) {
    for (auto& c : commands_.TakeAll(std::chrono::steady_clock::now() + std::chrono::milliseconds(50))) c();
  }
}

}  // namespace tailserve
