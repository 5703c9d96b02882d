// RouterCore against fake workers: dispatch, relay, re-dispatch, cancellation, queue limits.
#include "router/router_core.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "tests/test_sinks.h"

namespace tailserve {
namespace {

using ClientRecorder = RecordingSink<v1::GenerateResponse>;

// A worker whose Execute calls the test drives by hand.
class FakeWorker final : public WorkerClient {
 public:
  // on_done runs at most once, like gRPC's OnDone: whichever comes first of the test ending the
  // stream and the core cancelling it.
  struct Call {
    v1::Batch batch;
    std::function<void(v1::TokenEvent)> on_event;
    std::function<void(grpc::Status)> on_done;
  };
  struct Handle final : ExecuteCall {
    std::function<void(grpc::Status)> on_done;
    void Cancel() override { on_done(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }
  };

  explicit FakeWorker(int slots) : slots_(slots) {}

  std::shared_ptr<ExecuteCall> Execute(v1::Batch batch, std::function<void(v1::TokenEvent)> on_event,
                                       std::function<void(grpc::Status)> on_done) override {
    auto once = std::make_shared<std::atomic<bool>>(false);
    auto done = [once, on_done = std::move(on_done)](grpc::Status s) {
      if (!once->exchange(true)) on_done(std::move(s));
    };
    std::lock_guard lock(mu_);
    calls_.push_back({std::move(batch), std::move(on_event), done});
    auto h = std::make_shared<Handle>();
    h->on_done = done;
    cv_.notify_all();
    return h;
  }
  void Cancel(std::vector<uint64_t> ids) override {
    std::lock_guard lock(mu_);
    cancelled_ids_.insert(cancelled_ids_.end(), ids.begin(), ids.end());
    cv_.notify_all();
  }
  void Status(std::chrono::milliseconds, const v1::StatusRequest& request,
              std::function<void(absl::StatusOr<v1::WorkerStatus>)> done) override {
    {
      std::lock_guard lock(mu_);
      last_status_request_ = request;
    }
    v1::WorkerStatus s;
    {
      std::lock_guard lock(mu_);
      s = status_extra_;
    }
    s.set_ready(ready_);
    s.set_total_slots(slots_);
    done(s);
  }

  // Waits for the n-th Execute call (0-based).
  Call WaitCall(size_t n) {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(10), [&] { return calls_.size() > n; })) << "no call " << n;
    return calls_.size() > n ? calls_[n] : Call{};
  }
  size_t calls() {
    std::lock_guard lock(mu_);
    return calls_.size();
  }
  bool WaitCancelled(uint64_t id) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      return std::find(cancelled_ids_.begin(), cancelled_ids_.end(), id) != cancelled_ids_.end();
    });
  }
  std::atomic<bool> ready_{true};
  // Load fields every Status answer carries (waiting queue, step time, ...).
  void SetStatus(v1::WorkerStatus extra) {
    std::lock_guard lock(mu_);
    status_extra_ = std::move(extra);
  }
  v1::StatusRequest last_status_request() {
    std::lock_guard lock(mu_);
    return last_status_request_;
  }

 private:
  v1::WorkerStatus status_extra_;
  v1::StatusRequest last_status_request_;
  const int slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call> calls_;
  std::vector<uint64_t> cancelled_ids_;
};

v1::TokenEvent Event(uint64_t id, std::vector<int32_t> tokens, v1::FinishState state = v1::FINISH_STATE_RUNNING) {
  v1::TokenEvent ev;
  ev.set_free_slots(8);
  auto* s = ev.add_sequences();
  s->set_sequence_id(id);
  s->mutable_token_ids()->Add(tokens.begin(), tokens.end());
  s->set_state(state);
  return ev;
}

std::vector<int32_t> AllTokens(ClientRecorder& c) {
  std::vector<int32_t> out;
  for (const auto& m : c.messages()) out.insert(out.end(), m.token_ids().begin(), m.token_ids().end());
  return out;
}

std::string AllText(ClientRecorder& c) {
  std::string out;
  for (const auto& m : c.messages()) out += m.text();
  return out;
}

// The batcher batching.mode names, counting how often the core asks for its next deadline (once a
// loop iteration).
class CountingBatcher final : public Batcher {
 public:
  CountingBatcher(const BatchingConfig& b, const RouterConfig& r, std::atomic<int>& asks)
      : inner_(MakeBatcher(b, r)), asks_(asks) {}
  void Push(const QueuedRequest& r, bool requeued) override { inner_->Push(r, requeued); }
  bool Remove(uint64_t id) override { return inner_->Remove(id); }
  size_t size() const override { return inner_->size(); }
  std::vector<uint64_t> Next(SteadyTime now, size_t capacity, BatchReason* reason) override {
    return inner_->Next(now, capacity, reason);
  }
  std::optional<SteadyTime> NextDeadline() const override {
    ++asks_;
    return inner_->NextDeadline();
  }
  void SetLengthAware(bool on) override { inner_->SetLengthAware(on); }
  bool length_aware() const override { return inner_->length_aware(); }
  void SetStepSeconds(double seconds) override { inner_->SetStepSeconds(seconds); }

 private:
  std::unique_ptr<Batcher> inner_;
  std::atomic<int>& asks_;
};

class RouterCoreTest : public ::testing::Test {
 protected:
  void Start(int workers = 2, int slots = 8, int poll_ms = 20) {
    config_.batching.min_batch_size = 1;
    config_.router.timeout_ms = 0;
    config_.router.health_check_interval_ms = poll_ms;
    std::vector<std::string> names;
    std::vector<std::unique_ptr<WorkerClient>> clients;
    for (int i = 0; i < workers; ++i) {
      auto w = std::make_unique<FakeWorker>(slots);
      fakes_.push_back(w.get());
      clients.push_back(std::move(w));
      names.push_back("w" + std::to_string(i));
    }
    metrics_ = std::make_unique<RouterMetrics>(registry_, 60);
    core_ = std::make_unique<RouterCore>(config_, names, std::move(clients),
                                         std::make_unique<CountingBatcher>(config_.batching, config_.router, deadline_asks_),
                                         std::make_unique<LengthPredictor>(config_.predictor, nullptr, *metrics_),
                                         tokenizer_, *metrics_);
    core_->Start();
    for (int i = 0; i < 500 && !core_->ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(core_->ready());
  }
  std::shared_ptr<ClientRecorder> Send(uint64_t key, int max_tokens, std::vector<std::string> stop = {},
                                       v1::Priority priority = v1::PRIORITY_STANDARD, int ttft_slo_ms = 0,
                                       std::vector<int32_t> prompt = {'h', 'i'}) {
    ParsedRequest r;
    r.request_id = "r" + std::to_string(key);
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.stop = std::move(stop);
    r.priority = priority;
    r.ttft_slo_ms = ttft_slo_ms;
    auto sink = std::make_shared<ClientRecorder>();
    core_->Submit(key, r, sink, SystemClock::Get().Now());
    return sink;
  }
  // Waits for the worker call that dispatches request `key` (the first past calls[w] on any
  // worker), finishes its one sequence at once, and returns that worker's index (9 if none came).
  size_t FinishNextCall(uint64_t key, const std::shared_ptr<ClientRecorder>& client, std::vector<size_t>* calls) {
    for (int tries = 0; tries < 400; ++tries) {
      for (size_t w = 0; w < fakes_.size(); ++w) {
        if (fakes_[w]->calls() > (*calls)[w]) {
          FakeWorker::Call c = fakes_[w]->WaitCall((*calls)[w]++);
          c.on_event(Event(c.batch.sequences(0).sequence_id(), {'z'}, v1::FINISH_STATE_LENGTH));
          c.on_done(grpc::Status::OK);
          EXPECT_TRUE(client->WaitFinish().ok());
          return w;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "request " << key << " was not dispatched";
    return 9;
  }
  double CounterValue(const std::string& needle) {
    const std::string text = registry_.Serialize();
    const size_t at = text.find(needle + " ");
    return at == std::string::npos ? 0 : std::stod(text.substr(at + needle.size() + 1));
  }

  Config config_;
  Registry registry_;
  ByteTokenizer tokenizer_;
  std::unique_ptr<RouterMetrics> metrics_;
  std::vector<FakeWorker*> fakes_;
  std::atomic<int> deadline_asks_{0};  // outlives core_, whose batcher counts into it
  std::unique_ptr<RouterCore> core_;
};

TEST_F(RouterCoreTest, RelaysTokensAndFinishes) {
  Start(1);
  auto client = Send(1, 3);
  FakeWorker::Call call = fakes_[0]->WaitCall(0);
  ASSERT_EQ(call.batch.sequences_size(), 1);
  EXPECT_EQ(call.batch.sequences(0).max_tokens(), 3);
  EXPECT_TRUE(call.batch.sequences(0).sampling().has_seed());  // the router fixes a seed
  call.on_event(Event(1, {'a', 'b'}));
  call.on_event(Event(1, {'c'}, v1::FINISH_STATE_LENGTH));
  call.on_done(grpc::Status::OK);
  ASSERT_TRUE(client->WaitFinish().ok());
  EXPECT_EQ(AllTokens(*client), (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(AllText(*client), "abc");
  const auto last = client->messages().back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().completion_tokens(), 3);
  EXPECT_EQ(last.usage().prompt_tokens(), 2);
  EXPECT_EQ(last.timings().dispatches(), 1);
  EXPECT_EQ(CounterValue("tailserve_router_requests_total{outcome=\"length\"}"), 1);
}

// The fcfs baseline: each request goes at once, alone, to the worker with the most free slots
// (so four requests spread over two workers), with no step budget.
TEST_F(RouterCoreTest, FcfsDispatchesEachRequestAloneToTheLeastLoadedWorker) {
  config_.batching.mode = "fcfs";
  Start(2, 8);
  std::vector<std::shared_ptr<ClientRecorder>> clients;
  for (uint64_t k = 1; k <= 4; ++k) clients.push_back(Send(k, 5));
  int sequences = 0;
  for (FakeWorker* w : fakes_) {
    for (size_t n = 0; n < 2; ++n) {
      FakeWorker::Call c = w->WaitCall(n);
      ASSERT_EQ(c.batch.sequences_size(), 1);
      EXPECT_EQ(c.batch.sequences(0).step_budget(), 0);
      EXPECT_EQ(c.batch.sequences(0).predicted_steps(), 0);  // no prediction anywhere
      ++sequences;
      c.on_event(Event(c.batch.sequences(0).sequence_id(), {'a'}, v1::FINISH_STATE_LENGTH));
      c.on_done(grpc::Status::OK);
    }
  }
  EXPECT_EQ(sequences, 4);
  for (auto& c : clients) EXPECT_TRUE(c->WaitFinish().ok());
  EXPECT_EQ(CounterValue("tailserve_router_batches_total{reason=\"immediate\"}"), 4);
}

// slo dispatches at once as fcfs does, with what the worker's queue orders by: the prediction,
// the priority and the time already waited; no step budget. The first token teaches the placement.
TEST_F(RouterCoreTest, SloSendsThePredictionPriorityAndWait) {
  config_.batching.mode = "slo";
  Start(1, 8);
  auto client = Send(1, 5);
  FakeWorker::Call c = fakes_[0]->WaitCall(0);
  ASSERT_EQ(c.batch.sequences_size(), 1);
  const v1::Sequence& seq = c.batch.sequences(0);
  EXPECT_EQ(seq.step_budget(), 0);
  EXPECT_GT(seq.predicted_steps(), 0);
  EXPECT_EQ(seq.priority(), v1::PRIORITY_STANDARD);
  EXPECT_GE(seq.waited_ms(), 0);
  c.on_event(Event(seq.sequence_id(), {'a'}, v1::FINISH_STATE_LENGTH));
  c.on_done(grpc::Status::OK);
  EXPECT_TRUE(client->WaitFinish().ok());
  EXPECT_EQ(CounterValue("tailserve_router_ttft_prediction_abs_error_seconds_count"), 1);
}

// Objectives come from the class defaults unless the request sets its own, and a finished request
// is counted against them.
TEST_F(RouterCoreTest, FinishedRequestsAreCountedAgainstTheirObjectives) {
  config_.batching.mode = "fcfs";
  config_.router.standard_ttft_slo_ms = 60'000;
  config_.router.standard_tpot_slo_ms = 60'000;
  config_.router.batch_ttft_slo_ms = config_.router.batch_tpot_slo_ms = 0;  // none
  Start(1, 8);
  auto met = Send(1, 5);
  auto missed = Send(2, 5, {}, v1::PRIORITY_STANDARD, /*ttft_slo_ms=*/1);  // its own, unmeetable
  auto none = Send(3, 5, {}, v1::PRIORITY_BATCH);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // request 2's 1 ms passes
  for (size_t n = 0; n < 3; ++n) {
    FakeWorker::Call c = fakes_[0]->WaitCall(n);
    c.on_event(Event(c.batch.sequences(0).sequence_id(), {'a', 'b'}, v1::FINISH_STATE_LENGTH));
    c.on_done(grpc::Status::OK);
  }
  for (auto* c : {&met, &missed, &none}) ASSERT_TRUE((*c)->WaitFinish().ok());
  EXPECT_EQ(CounterValue("tailserve_router_slo_requests_total{class=\"standard\"}"), 2);
  EXPECT_EQ(CounterValue("tailserve_router_slo_attained_total{class=\"standard\",slo=\"ttft\"}"), 1);
  EXPECT_EQ(CounterValue("tailserve_router_slo_attained_total{class=\"standard\",slo=\"tpot\"}"), 2);
  EXPECT_EQ(CounterValue("tailserve_router_slo_attained_total{class=\"standard\",slo=\"both\"}"), 1);
  EXPECT_EQ(CounterValue("tailserve_router_slo_requests_total{class=\"batch\"}"), 0);
}

// Cache-aware placement: a prompt goes where its prefix was sent before, while that worker is the
// fastest to a first token; once its queue outweighs the saved prefill, elsewhere.
TEST_F(RouterCoreTest, SloPlacesAPromptWhereItsPrefixIsCachedUntilThatWorkerIsLoaded) {
  config_.batching.mode = "slo";
  config_.router.slo_reject_waiting = 0;
  Start(2, 8, /*poll_ms=*/5);
  v1::WorkerStatus idle;
  idle.set_max_waiting(64);
  idle.set_step_token_budget(64);
  idle.set_step_time_p50_seconds(0.01);
  for (FakeWorker* f : fakes_) f->SetStatus(idle);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<int32_t> shared(200);
  for (int i = 0; i < 200; ++i) shared[static_cast<size_t>(i)] = 'a' + i % 26;
  auto with_suffix = [&](int32_t t) {
    std::vector<int32_t> p = shared;
    p.insert(p.end(), {t, t, t});
    return p;
  };
  // Which worker got call `n` of the run, and the call itself answered at once.
  std::vector<size_t> calls(2, 0);
  auto serve = [&](uint64_t key, std::vector<int32_t> prompt) {
    return FinishNextCall(key, Send(key, 1, {}, v1::PRIORITY_STANDARD, 0, std::move(prompt)), &calls);
  };
  const size_t home = serve(1, with_suffix('1'));
  EXPECT_EQ(serve(2, with_suffix('2')), home) << "192 of 203 tokens cached there: 1 prefill step against 4";
  EXPECT_EQ(serve(3, with_suffix('3')), home);
  // The home worker now has 2,000 prompt tokens queued: 32 steps before this one's first.
  v1::WorkerStatus loaded = idle;
  loaded.set_queued_prefill_tokens(2000);
  fakes_[home]->SetStatus(loaded);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(serve(4, with_suffix('4')), 1 - home) << "the queue outweighs the cached prefix";
}

// A session's request whose prefix no worker is known to hold goes where the session's last one
// went while that worker is at most a step slower; further behind, or with affinity off, the
// fastest worker takes it.
TEST_F(RouterCoreTest, SloKeepsASessionOnItsWorkerWhileItIsAtMostAStepSlower) {
  config_.batching.mode = "slo";
  config_.router.slo_reject_waiting = 0;
  config_.router.cache_aware_routing = false;
  Start(2, 8, /*poll_ms=*/5);
  v1::WorkerStatus idle;
  idle.set_max_waiting(64);
  idle.set_step_token_budget(64);
  idle.set_step_time_p50_seconds(0.01);
  for (FakeWorker* f : fakes_) f->SetStatus(idle);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<size_t> calls(2, 0);
  auto serve = [&](uint64_t key, const std::string& session) {
    ParsedRequest r;
    r.request_id = "r" + std::to_string(key);
    r.prompt = {'h', 'i'};
    r.max_tokens = 1;
    r.session_id = session;
    auto client = std::make_shared<ClientRecorder>();
    core_->Submit(key, r, client, SystemClock::Get().Now());
    return FinishNextCall(key, client, &calls);
  };
  auto queue_on = [&](size_t w, int tokens) {
    v1::WorkerStatus st = idle;
    st.set_queued_prefill_tokens(tokens);
    fakes_[w]->SetStatus(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  // A served request's last event resets the worker's load fields: each serve below first
  // re-reports the queue and waits for a poll to read it.
  const size_t home = serve(1, "chat-1");
  queue_on(home, 100);  // its first token two steps away, the other's one
  EXPECT_EQ(serve(2, "chat-1"), home) << "one step slower: the session stays";
  queue_on(home, 100);
  EXPECT_EQ(serve(3, "chat-2"), 1 - home) << "no session there: the fastest";
  queue_on(home, 300);  // five steps
  EXPECT_EQ(serve(4, "chat-1"), 1 - home) << "four steps slower: the session moves";
  EXPECT_EQ(CounterValue("\ntailserve_router_session_affinity_placements_total"), 1);
}

// slo mode refuses at arrival what no worker can serve in time once queues are deep, with the
// documented status and a retry-after hint; batch priority goes first, whatever its objective.
TEST_F(RouterCoreTest, SloRejectsEarlyWhatNoWorkerCanMeet) {
  config_.batching.mode = "slo";
  config_.router.slo_reject_waiting = 4;
  config_.router.standard_ttft_slo_ms = 500;
  config_.router.batch_ttft_slo_ms = 0;
  Start(1, 8, /*poll_ms=*/5);
  // 100 ms steps, every prompt whole in one step (no budget), 6 waiting: 0.7 s to a first token.
  v1::WorkerStatus loaded;
  loaded.set_max_waiting(64);
  loaded.set_waiting_sequences(6);
  loaded.set_step_time_p50_seconds(0.1);
  fakes_[0]->SetStatus(loaded);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polls see it
  auto late = Send(1, 5);
  EXPECT_EQ(late->WaitFinish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(late->WaitFinish().error_message().find("no worker can meet ttft_slo_ms 500 (predicted 700 ms"),
            std::string::npos)
      << late->WaitFinish().error_message();
  EXPECT_NE(late->WaitFinish().error_message().find("retry after 0.2 s"), std::string::npos);
  auto batch = Send(2, 5, {}, v1::PRIORITY_BATCH);
  EXPECT_EQ(batch->WaitFinish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto relaxed = Send(3, 5, {}, v1::PRIORITY_STANDARD, /*ttft_slo_ms=*/2000);  // 0.7 s meets it
  FakeWorker::Call c = fakes_[0]->WaitCall(0);
  EXPECT_EQ(c.batch.sequences(0).sequence_id(), 3u);
  c.on_event(Event(3, {'a'}, v1::FINISH_STATE_LENGTH));
  c.on_done(grpc::Status::OK);
  EXPECT_TRUE(relaxed->WaitFinish().ok());
  EXPECT_EQ(CounterValue("tailserve_router_slo_rejections_total{class=\"standard\"}"), 1);
  EXPECT_EQ(CounterValue("tailserve_router_slo_rejections_total{class=\"batch\"}"), 1);
  // A shallow queue takes everything, however slow.
  loaded.set_waiting_sequences(3);
  fakes_[0]->SetStatus(loaded);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto shallow = Send(4, 5, {}, v1::PRIORITY_STANDARD, /*ttft_slo_ms=*/1);
  FakeWorker::Call c2 = fakes_[0]->WaitCall(1);
  EXPECT_EQ(c2.batch.sequences(0).sequence_id(), 4u);
  c2.on_event(Event(4, {'a'}, v1::FINISH_STATE_LENGTH));
  c2.on_done(grpc::Status::OK);
  EXPECT_TRUE(shallow->WaitFinish().ok());
  // Prompts prefilling in chunks are queued for their first token too: 1 waiting + 3 prefilling
  // reach the depth, 3,000 queued prompt tokens at 512 a 100 ms step miss 500 ms.
  v1::WorkerStatus chunking;
  chunking.set_max_waiting(64);
  chunking.set_waiting_sequences(1);
  chunking.set_prefilling_sequences(3);
  chunking.set_queued_prefill_tokens(3000);
  chunking.set_step_token_budget(512);
  chunking.set_step_time_p50_seconds(0.1);
  fakes_[0]->SetStatus(chunking);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto chunked = Send(5, 5);
  EXPECT_EQ(chunked->WaitFinish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(chunked->WaitFinish().error_message().find(" ms with 4 queued); retry after "), std::string::npos)
      << chunked->WaitFinish().error_message();
}

// A worker refuses one sequence alone (its model cannot run it): that client gets INVALID_ARGUMENT
// with the worker's reason, its batch mate runs on.
TEST_F(RouterCoreTest, SequenceRefusedByTheWorkerFailsAloneAsInvalidArgument) {
  Start(1);
  auto a = Send(1, 3), b = Send(2, 3);
  // One batch or two, whichever the batcher formed: find each sequence's call.
  std::map<uint64_t, FakeWorker::Call> call_of;
  for (size_t n = 0; call_of.size() < 2; ++n) {
    FakeWorker::Call c = fakes_[0]->WaitCall(n);
    if (c.batch.sequences_size() == 0) break;
    for (const auto& seq : c.batch.sequences()) call_of[seq.sequence_id()] = c;
  }
  ASSERT_EQ(call_of.size(), 2u);
  v1::TokenEvent refused = Event(2, {}, v1::FINISH_STATE_INVALID);
  refused.mutable_sequences(0)->set_error("longer than the whole KV cache");
  call_of[2].on_event(refused);
  const grpc::Status s = b->WaitFinish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "longer than the whole KV cache");
  EXPECT_FALSE(a->finished());
  call_of[1].on_event(Event(1, {'x', 'y', 'z'}, v1::FINISH_STATE_LENGTH));
  call_of[1].on_done(grpc::Status::OK);
  ASSERT_TRUE(a->WaitFinish().ok());
  EXPECT_EQ(AllText(*a), "xyz");
  EXPECT_EQ(CounterValue("tailserve_router_requests_total{outcome=\"invalid_argument\"}"), 1);
}

TEST_F(RouterCoreTest, BudgetOverrunIsRedispatchedWithItsTokensAndADoubledBudget) {
  config_.batching.mode = "ladb";  // slo sends no step budget: a sequence keeps running where it is
  Start(1);
  auto client = Send(1, 40);
  FakeWorker::Call first = fakes_[0]->WaitCall(0);
  const int32_t budget = first.batch.sequences(0).step_budget();
  EXPECT_GT(budget, 0);
  first.on_event(Event(1, {'x', 'y'}, v1::FINISH_STATE_BUDGET_EXHAUSTED));
  first.on_done(grpc::Status::OK);
  FakeWorker::Call second = fakes_[0]->WaitCall(1);
  const v1::Sequence& s = second.batch.sequences(0);
  EXPECT_EQ(std::vector<int32_t>(s.generated_token_ids().begin(), s.generated_token_ids().end()),
            (std::vector<int32_t>{'x', 'y'}));
  EXPECT_EQ(s.step_budget(), 2 * budget);
  EXPECT_EQ(s.sampling().seed(), first.batch.sequences(0).sampling().seed());
  second.on_event(Event(1, {'z'}, v1::FINISH_STATE_STOP));
  second.on_done(grpc::Status::OK);
  ASSERT_TRUE(client->WaitFinish().ok());
  EXPECT_EQ(AllTokens(*client), (std::vector<int32_t>{'x', 'y', 'z'}));
  EXPECT_EQ(client->messages().back().timings().dispatches(), 2);
  EXPECT_EQ(CounterValue("tailserve_router_redispatches_total{reason=\"budget\"}"), 1);
}

TEST_F(RouterCoreTest, BrokenStreamMovesSequencesToAnotherWorker) {
  Start(2);
  auto client = Send(1, 10);
  // Whichever worker got it, break its stream mid-way.
  FakeWorker* first = nullptr;
  for (int i = 0; i < 1000 && !first; ++i) {
    for (FakeWorker* f : fakes_) if (f->calls() > 0) first = f;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_NE(first, nullptr);
  FakeWorker* other = first == fakes_[0] ? fakes_[1] : fakes_[0];
  first->ready_ = false;  // stays out of rotation
  FakeWorker::Call call = first->WaitCall(0);
  call.on_event(Event(1, {'a', 'b', 'c'}));
  call.on_done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset"));
  FakeWorker::Call again = other->WaitCall(0);
  EXPECT_EQ(again.batch.sequences(0).generated_token_ids_size(), 3);
  again.on_event(Event(1, {'d'}, v1::FINISH_STATE_LENGTH));
  again.on_done(grpc::Status::OK);
  ASSERT_TRUE(client->WaitFinish().ok());
  EXPECT_EQ(AllText(*client), "abcd");
  EXPECT_EQ(CounterValue("tailserve_router_redispatches_total{reason=\"worker_failure\"}"), 1);
}

TEST_F(RouterCoreTest, GivesUpAfterMaxFailedDispatches) {
  config_.router.max_failed_dispatches = 2;
  Start(1);
  auto client = Send(1, 10);
  for (size_t n = 0; n < 2; ++n) {
    FakeWorker::Call c = fakes_[0]->WaitCall(n);
    c.on_done(grpc::Status(grpc::StatusCode::INTERNAL, "boom"));
  }
  const grpc::Status s = client->WaitFinish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.error_message(), "gave up after 2 failed dispatches");
}

TEST_F(RouterCoreTest, RejectedBatchIsRequeuedWithoutCountingAsADispatch) {
  Start(1);
  auto client = Send(1, 10);
  fakes_[0]->WaitCall(0).on_done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "full"));
  FakeWorker::Call c = fakes_[0]->WaitCall(1);  // back in after the next status poll
  c.on_event(Event(1, {'q'}, v1::FINISH_STATE_STOP));
  c.on_done(grpc::Status::OK);
  ASSERT_TRUE(client->WaitFinish().ok());
  EXPECT_EQ(client->messages().back().timings().dispatches(), 1);
  EXPECT_EQ(CounterValue("tailserve_router_redispatches_total{reason=\"rejected\"}"), 1);
}

// The label values are what the README, the cluster tests and bench/ladb_table.py match.
TEST(RequeueReasonTest, MetricLabels) {
  EXPECT_STREQ(RequeueReasonLabel(RequeueReason::kBudgetExhausted), "budget");
  EXPECT_STREQ(RequeueReasonLabel(RequeueReason::kWorkerFailure), "worker_failure");
  EXPECT_STREQ(RequeueReasonLabel(RequeueReason::kRejected), "rejected");
}

// A worker that refused a batch (say its KV cache is full: free slots do not show it) is not sent
// another on its next step event, only once one of its sequences ends (or a Status poll comes).
TEST_F(RouterCoreTest, ARefusingWorkerGetsNoBatchUntilOneOfItsSequencesEnds) {
  config_.batching.max_batch_size = 1;
  Start(1, 8, /*poll_ms=*/60'000);  // no poll clears it during the test
  auto running = Send(1, 10);
  FakeWorker::Call a = fakes_[0]->WaitCall(0);
  auto refused = Send(2, 10);
  fakes_[0]->WaitCall(1).on_done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "KV cache: no room"));
  a.on_event(Event(1, {'a'}));  // a step: 8 slots free, but nothing freed
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(fakes_[0]->calls(), 2u);
  a.on_event(Event(1, {'b'}, v1::FINISH_STATE_LENGTH));
  a.on_done(grpc::Status::OK);
  FakeWorker::Call b = fakes_[0]->WaitCall(2);
  EXPECT_EQ(b.batch.sequences(0).sequence_id(), 2u);
  b.on_event(Event(2, {'c'}, v1::FINISH_STATE_STOP));
  b.on_done(grpc::Status::OK);
  ASSERT_TRUE(running->WaitFinish().ok());
  ASSERT_TRUE(refused->WaitFinish().ok());
}

TEST_F(RouterCoreTest, CancelWhileRunningCancelsOnTheWorker) {
  Start(1);
  auto client = Send(7, 10);
  FakeWorker::Call c = fakes_[0]->WaitCall(0);
  core_->Cancel(7, false);
  EXPECT_EQ(client->WaitFinish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(fakes_[0]->WaitCancelled(7));
  c.on_event(Event(7, {'x'}, v1::FINISH_STATE_CANCELLED));  // late events are dropped
  c.on_done(grpc::Status::OK);
  EXPECT_TRUE(AllTokens(*client).empty());
  core_->Cancel(12345, false);  // unknown: ignored
}

// The gRPC server accepts calls until it shuts down, after the core has stopped: those are
// refused at once instead of waiting in a queue nobody reads (which also kept Shutdown waiting).
TEST_F(RouterCoreTest, RequestAfterStopIsRefusedAtOnce) {
  Start(1);
  core_->Stop();
  auto late = Send(1, 5);
  ASSERT_TRUE(late->finished());
  EXPECT_EQ(late->WaitFinish().error_code(), grpc::StatusCode::UNAVAILABLE);
  core_->Cancel(1, false);  // a late cancel is a no-op, not a hang or a crash
}

TEST_F(RouterCoreTest, QueueFullIsResourceExhausted) {
  config_.router.max_queue_size = 2;
  Start(1);
  fakes_[0]->ready_ = false;
  // Wait for the poll to take the only worker out, so nothing leaves the queue.
  for (int i = 0; i < 500 && core_->ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_FALSE(core_->ready());
  auto a = Send(1, 5), b = Send(2, 5), c = Send(3, 5);
  const grpc::Status s = c->WaitFinish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "queue full: 2 requests waiting (router.max_queue_size)");
  EXPECT_FALSE(a->finished());
  core_->Cancel(1, true);
  EXPECT_EQ(a->WaitFinish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  fakes_[0]->ready_ = true;  // back in rotation: the queued request runs
  FakeWorker::Call call = fakes_[0]->WaitCall(0);
  EXPECT_EQ(call.batch.sequences(0).sequence_id(), 2u);
}

// Router replicas share workers, which know sequences by id: each process's keys start at its own
// random prefix (a collision between two processes is a 2^-31 event).
TEST(RouterKeysTest, EachProcessStartsItsKeysAtARandomPrefix) {
  const uint64_t a = FirstSequenceKey(), b = FirstSequenceKey();
  EXPECT_NE(a, b);
  for (uint64_t k : {a, b}) {
    EXPECT_EQ(k & 0xffffffffu, 1u);        // a counter from 1 below the prefix
    EXPECT_LT(k, uint64_t{1} << 63);      // far from the worker's warm-up id (~0)
    EXPECT_NE(k >> 32, 0u);
  }
}

// Every worker full and a request overdue: the core waits for room (a step event, a batch's end,
// a poll) instead of waking for the past deadline again and again.
TEST_F(RouterCoreTest, SaturatedWorkersDoNotSpinTheCore) {
  Start(1, 1);
  auto running = Send(1, 50);
  FakeWorker::Call call = fakes_[0]->WaitCall(0);  // the only slot, held
  auto waiting = Send(2, 5);                       // overdue at once (timeout 0), no room
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int before = deadline_asks_.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // ~15 polls of 20 ms in 300 ms, an iteration or two each; a spinning loop asks ~10^5 times.
  EXPECT_LT(deadline_asks_.load() - before, 300);
  EXPECT_EQ(fakes_[0]->calls(), 1u);
  call.on_event(Event(1, {7}, v1::FINISH_STATE_LENGTH));  // room again: the waiting one goes
  FakeWorker::Call next = fakes_[0]->WaitCall(1);
  EXPECT_EQ(next.batch.sequences(0).sequence_id(), 2u);
}

TEST_F(RouterCoreTest, StopStringTruncatesAndIsNeverStreamed) {
  Start(1);
  auto client = Send(1, 50, {"END"});
  FakeWorker::Call c = fakes_[0]->WaitCall(0);
  c.on_event(Event(1, {'a', 'b', 'E'}));
  c.on_event(Event(1, {'N'}));
  c.on_event(Event(1, {'D', 'z'}));
  ASSERT_TRUE(client->WaitFinish().ok());
  EXPECT_EQ(AllText(*client), "ab");
  EXPECT_EQ(client->messages().back().finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_TRUE(fakes_[0]->WaitCancelled(1));  // the worker stops generating for it
  c.on_done(grpc::Status::CANCELLED);
}

TEST_F(RouterCoreTest, StopTokenIsNotDecodedIntoText) {
  Start(1);
  ParsedRequest r;
  r.prompt = {'x'};
  r.max_tokens = 10;
  r.stop_token_ids = {'!'};
  auto client = std::make_shared<ClientRecorder>();
  core_->Submit(1, r, client, SystemClock::Get().Now());
  FakeWorker::Call c = fakes_[0]->WaitCall(0);
  c.on_event(Event(1, {'o', 'k', '!'}, v1::FINISH_STATE_STOP));
  c.on_done(grpc::Status::OK);
  ASSERT_TRUE(client->WaitFinish().ok());
  EXPECT_EQ(AllText(*client), "ok");
  EXPECT_EQ(AllTokens(*client).size(), 3u);
}

}  // namespace
}  // namespace tailserve
