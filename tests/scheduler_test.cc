#include "worker/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <map>

#include "tests/test_sinks.h"
#include "worker/backends/sim/sim_engine.h"

namespace tailserve {
namespace {

using Sink = RecordingSink<v1::TokenEvent>;

SimBackendConfig FreeSim() {
  SimBackendConfig c;
  c.step_base_ms = c.step_per_sequence_ms = c.step_per_kv_token_ns = c.step_per_prefill_token_ms = 0;
  c.vocab_size = 1000;
  return c;
}

v1::Sequence Seq(uint64_t id, int max_tokens, uint64_t seed = 7) {
  v1::Sequence s;
  s.set_sequence_id(id);
  for (int t : {5, 6, 7}) s.add_prompt_token_ids(t);
  s.set_max_tokens(max_tokens);
  s.mutable_sampling()->set_seed(seed);
  return s;
}

// Tokens and final state per sequence, in order.
struct Outcome {
  std::vector<int32_t> tokens;
  v1::FinishState state = v1::FINISH_STATE_RUNNING;
};
std::map<uint64_t, Outcome> Collect(Sink& sink) {
  std::map<uint64_t, Outcome> out;
  for (const auto& ev : sink.messages()) {
    for (const auto& se : ev.sequences()) {
      auto& o = out[se.sequence_id()];
      o.tokens.insert(o.tokens.end(), se.token_ids().begin(), se.token_ids().end());
      if (se.state() != v1::FINISH_STATE_RUNNING) o.state = se.state();
    }
  }
  return out;
}

// The stream's first event is one sequence refused before any token (Admit's refusal): checks it
// and returns the event.
v1::TokenEvent ExpectFirstEventRefuses(Sink& sink, uint64_t id, v1::FinishState state, const std::string& error) {
  const v1::TokenEvent first = sink.messages().front();
  EXPECT_EQ(first.sequences_size(), 1);
  if (first.sequences_size() == 1) {
    EXPECT_EQ(first.sequences(0).sequence_id(), id);
    EXPECT_EQ(first.sequences(0).state(), state);
    EXPECT_EQ(first.sequences(0).error(), error);
  }
  return first;
}

class SchedulerTest : public ::testing::Test {
 protected:
  explicit SchedulerTest(SimBackendConfig sim = FreeSim()) : engine_(sim, "test"), metrics_(registry_, 60) {}
  void Start(int slots) {
    scheduler_ = std::make_unique<Scheduler>(engine_, slots, metrics_);
    scheduler_->Start();
  }
  Registry registry_;
  SimEngine engine_;
  WorkerMetrics metrics_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, RunsEachSequenceToItsLength) {
  Start(4);
  auto sink = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 5, 11);
  *b.add_sequences() = Seq(2, 9, 12);
  scheduler_->Submit(sink, b);
  ASSERT_TRUE(sink->WaitFinish().ok());
  auto out = Collect(*sink);
  ASSERT_EQ(out[1].tokens.size(), 5u);
  ASSERT_EQ(out[2].tokens.size(), 9u);
  EXPECT_EQ(out[1].state, v1::FINISH_STATE_LENGTH);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(out[2].tokens[i], SimToken(12, i, 1000)) << i;
  EXPECT_TRUE(sink->messages().front().simulated());
  EXPECT_EQ(scheduler_->Snapshot().free_slots, 4);
}

TEST_F(SchedulerTest, StepBudgetHandsBackUnfinishedAndResumeContinues) {
  Start(4);
  auto first = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 10);
  b.mutable_sequences(0)->set_step_budget(3);
  scheduler_->Submit(first, b);
  ASSERT_TRUE(first->WaitFinish().ok());
  auto out = Collect(*first);
  ASSERT_EQ(out[1].tokens.size(), 3u);
  EXPECT_EQ(out[1].state, v1::FINISH_STATE_BUDGET_EXHAUSTED);

  // Re-dispatch with the tokens so far: the sequence continues, nothing repeated or skipped.
  auto second = std::make_shared<Sink>();
  b.mutable_sequences(0)->mutable_generated_token_ids()->Add(out[1].tokens.begin(), out[1].tokens.end());
  b.mutable_sequences(0)->set_step_budget(0);
  scheduler_->Submit(second, b);
  ASSERT_TRUE(second->WaitFinish().ok());
  auto rest = Collect(*second);
  ASSERT_EQ(rest[1].tokens.size(), 7u);
  EXPECT_EQ(rest[1].state, v1::FINISH_STATE_LENGTH);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(rest[1].tokens[i], SimToken(7, i + 3, 1000));
}

TEST_F(SchedulerTest, StopTokenEndsTheSequence) {
  Start(2);
  auto sink = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 50);
  const int32_t stop = SimToken(7, 4, 1000);
  int expected = 0;
  while (SimToken(7, expected, 1000) != stop) ++expected;
  b.mutable_sequences(0)->add_stop_token_ids(stop);
  scheduler_->Submit(sink, b);
  ASSERT_TRUE(sink->WaitFinish().ok());
  auto out = Collect(*sink);
  EXPECT_EQ(out[1].state, v1::FINISH_STATE_STOP);
  ASSERT_EQ(out[1].tokens.size(), static_cast<size_t>(expected + 1));
  EXPECT_EQ(out[1].tokens.back(), stop);
}

TEST_F(SchedulerTest, RejectsWhatDoesNotFitOrIsInvalid) {
  Start(1);
  v1::Batch two;
  *two.add_sequences() = Seq(1, 5);
  *two.add_sequences() = Seq(2, 5);
  auto full = std::make_shared<Sink>();
  scheduler_->Submit(full, two);
  EXPECT_EQ(full->WaitFinish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(full->messages().empty());

  v1::Batch bad;
  *bad.add_sequences() = Seq(3, 5);
  bad.mutable_sequences(0)->add_prompt_token_ids(1000);
  auto invalid = std::make_shared<Sink>();
  scheduler_->Submit(invalid, bad);
  EXPECT_TRUE(invalid->WaitFinish().ok());  // refused alone, by an event naming why
  ASSERT_EQ(invalid->messages().size(), 1u);
  EXPECT_EQ(invalid->messages()[0].sequences(0).state(), v1::FINISH_STATE_INVALID);
  EXPECT_EQ(invalid->messages()[0].sequences(0).error(), "token id 1000 outside the vocabulary [0, 1000)");

  v1::Batch empty;
  auto none = std::make_shared<Sink>();
  scheduler_->Submit(none, empty);
  EXPECT_EQ(none->WaitFinish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::Batch done;
  *done.add_sequences() = Seq(4, 1);
  done.mutable_sequences(0)->add_generated_token_ids(1);
  auto nothing_left = std::make_shared<Sink>();
  scheduler_->Submit(nothing_left, done);
  EXPECT_TRUE(nothing_left->WaitFinish().ok());
  EXPECT_EQ(Collect(*nothing_left)[4].state, v1::FINISH_STATE_INVALID);
  EXPECT_EQ(scheduler_->Snapshot().free_slots, 1);
}

TEST_F(SchedulerTest, AnInvalidSequenceIsRefusedAloneAndItsBatchMatesRun) {
  Start(4);
  v1::Batch b;
  *b.add_sequences() = Seq(1, 5, 11);
  *b.add_sequences() = Seq(2, 5);
  b.mutable_sequences(1)->add_prompt_token_ids(-3);
  *b.add_sequences() = Seq(3, 7, 13);
  auto sink = std::make_shared<Sink>();
  scheduler_->Submit(sink, b);
  ASSERT_TRUE(sink->WaitFinish().ok());
  const v1::TokenEvent first =
      ExpectFirstEventRefuses(*sink, 2, v1::FINISH_STATE_INVALID, "token id -3 outside the vocabulary [0, 1000)");
  EXPECT_EQ(first.free_slots(), 2);
  auto out = Collect(*sink);
  EXPECT_EQ(out[1].state, v1::FINISH_STATE_LENGTH);
  EXPECT_EQ(out[1].tokens.size(), 5u);
  EXPECT_EQ(out[3].state, v1::FINISH_STATE_LENGTH);
  EXPECT_EQ(out[3].tokens.size(), 7u);
  EXPECT_TRUE(out[2].tokens.empty());
}

// The worker checks sampling itself (anyone who reaches its port skips the router's checks): each
// hostile value refuses its sequence alone, naming the field.
TEST_F(SchedulerTest, HostileSamplingIsRefusedNamingTheField) {
  Start(4);
  struct Case {
    std::function<void(v1::SamplingParams*)> set;
    std::string error;
  };
  const std::vector<Case> cases = {
      {[](auto* p) { p->set_temperature(std::nanf("")); }, "sampling.temperature: must be in [0, 100], got nan"},
      {[](auto* p) { p->set_temperature(-1); }, "sampling.temperature: must be in [0, 100], got -1"},
      {[](auto* p) { p->set_top_p(7); }, "sampling.top_p: must be in [0, 1] (0 means 1), got 7"},
      {[](auto* p) { p->set_top_k(-5); }, "sampling.top_k: must be >= 0, got -5"},
      {[](auto* p) { p->set_logprobs(true), p->set_top_logprobs(21); }, "sampling.top_logprobs: must be in [0, 20], got 21"},
      {[](auto* p) { p->set_top_logprobs(3); }, "sampling.top_logprobs: needs sampling.logprobs"},
  };
  for (const Case& c : cases) {
    v1::Batch b;
    *b.add_sequences() = Seq(1, 5);
    c.set(b.mutable_sequences(0)->mutable_sampling());
    *b.add_sequences() = Seq(2, 3);
    auto sink = std::make_shared<Sink>();
    scheduler_->Submit(sink, b);
    ASSERT_TRUE(sink->WaitFinish().ok());
    ExpectFirstEventRefuses(*sink, 1, v1::FINISH_STATE_INVALID, c.error);
    EXPECT_EQ(Collect(*sink)[2].tokens.size(), 3u) << c.error;  // its batch mate ran
  }
}

// With logprobs asked, every token comes with one entry (the simulator's tokens are certain:
// log-probability 0, and the token itself its only alternative); without, none.
TEST_F(SchedulerTest, LogprobsComeWithEachTokenWhenAsked) {
  Start(4);
  v1::Batch b;
  *b.add_sequences() = Seq(1, 6, 11);
  b.mutable_sequences(0)->mutable_sampling()->set_logprobs(true);
  b.mutable_sequences(0)->mutable_sampling()->set_top_logprobs(3);
  *b.add_sequences() = Seq(2, 4, 12);
  auto sink = std::make_shared<Sink>();
  scheduler_->Submit(sink, b);
  ASSERT_TRUE(sink->WaitFinish().ok());
  int with = 0;
  for (const auto& ev : sink->messages()) {
    for (const auto& se : ev.sequences()) {
      if (se.sequence_id() == 2) {
        EXPECT_EQ(se.logprobs_size(), 0);
        continue;
      }
      ASSERT_EQ(se.logprobs_size(), se.token_ids_size());
      for (int i = 0; i < se.token_ids_size(); ++i, ++with) {
        EXPECT_EQ(se.logprobs(i).logprob(), 0.0f);
        ASSERT_EQ(se.logprobs(i).top_token_ids_size(), 1);
        EXPECT_EQ(se.logprobs(i).top_token_ids(0), se.token_ids(i));
      }
    }
  }
  EXPECT_EQ(with, 6);
}

class SlowSchedulerTest : public SchedulerTest {
 protected:
  static SimBackendConfig Slow() {
    SimBackendConfig c = FreeSim();
    c.step_base_ms = 1;
    return c;
  }
  SlowSchedulerTest() : SchedulerTest(Slow()) {}
};

// An id already running here is a conflict, not the request's fault: handed back (CANCELLED) for
// the router to run elsewhere, while the running one is untouched.
TEST_F(SlowSchedulerTest, AnIdAlreadyRunningIsHandedBack) {
  Start(4);
  auto first = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 1'000'000);
  scheduler_->Submit(first, b);
  ASSERT_TRUE(first->WaitFor([](auto& m) { return !m.empty(); }));
  auto second = std::make_shared<Sink>();
  scheduler_->Submit(second, b);
  EXPECT_TRUE(second->WaitFinish().ok());
  ASSERT_EQ(second->messages().size(), 1u);
  EXPECT_EQ(second->messages()[0].sequences(0).state(), v1::FINISH_STATE_CANCELLED);
  EXPECT_EQ(second->messages()[0].sequences(0).error(), "sequence_id: 1 is already running");
  EXPECT_FALSE(first->finished());
  EXPECT_EQ(scheduler_->Snapshot().running, 1);
}

TEST_F(SlowSchedulerTest, CancelFreesTheSlot) {
  Start(2);
  auto sink = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 1'000'000);
  *b.add_sequences() = Seq(2, 1'000'000);
  scheduler_->Submit(sink, b);
  ASSERT_TRUE(sink->WaitFor([](auto& m) { return m.size() >= 3; }));
  EXPECT_EQ(scheduler_->Snapshot().free_slots, 0);
  std::promise<int> cancelled;
  scheduler_->Cancel({1, 99}, [&](int n) { cancelled.set_value(n); });
  EXPECT_EQ(cancelled.get_future().get(), 1);
  EXPECT_EQ(scheduler_->Snapshot().free_slots, 1);
  EXPECT_FALSE(sink->finished());  // sequence 2 still runs
  EXPECT_EQ(Collect(*sink)[1].state, v1::FINISH_STATE_CANCELLED);
  // The cancel's own event says the slot is free (a router takes free_slots from every event);
  // sequence 2's steps go on meanwhile, so it is found by its state, not as the last event.
  std::optional<v1::TokenEvent> cancel_event;
  for (const v1::TokenEvent& ev : sink->messages()) {
    if (ev.sequences_size() == 1 && ev.sequences(0).state() == v1::FINISH_STATE_CANCELLED) cancel_event = ev;
  }
  ASSERT_TRUE(cancel_event.has_value());
  EXPECT_EQ(cancel_event->free_slots(), 1);

  scheduler_->CancelSink(sink);
  EXPECT_TRUE(sink->WaitFinish().ok());
  EXPECT_EQ(scheduler_->Snapshot().free_slots, 2);
}

TEST_F(SlowSchedulerTest, StopHandsBackRunningSequencesAsUnavailable) {
  Start(2);
  auto sink = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 1'000'000);
  scheduler_->Submit(sink, b);
  ASSERT_TRUE(sink->WaitFor([](auto& m) { return !m.empty(); }));
  scheduler_->Stop();
  EXPECT_EQ(sink->WaitFinish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(sink->finishes(), 1);
  // After the stop (the gRPC server may still take a call): refused at once.
  auto late = std::make_shared<Sink>();
  scheduler_->Submit(late, b);
  ASSERT_TRUE(late->finished());
  EXPECT_EQ(late->WaitFinish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// Cancel and Execute are separate RPCs, so a router's cancel can overtake the Execute carrying
// the sequence: the worker remembers the id and refuses the sequence (CANCELLED) when it arrives,
// instead of running it unseen to its step budget; for kEarlyCancelTtl only.
TEST(SchedulerEarlyCancelTest, ACancelThatOvertakesItsExecuteRefusesTheSequence) {
  Registry registry;
  WorkerMetrics metrics(registry, 60);
  SimEngine engine(FreeSim(), "test");
  FakeClock clock;
  Scheduler scheduler(engine, 4, metrics, clock);
  scheduler.Start();
  std::promise<int> cancelled;
  scheduler.Cancel({1, 3}, [&](int n) { cancelled.set_value(n); });
  EXPECT_EQ(cancelled.get_future().get(), 0);

  v1::Batch b;
  *b.add_sequences() = Seq(1, 5, 11);
  *b.add_sequences() = Seq(2, 5, 12);
  auto sink = std::make_shared<Sink>();
  scheduler.Submit(sink, b);
  ASSERT_TRUE(sink->WaitFinish().ok());
  ExpectFirstEventRefuses(*sink, 1, v1::FINISH_STATE_CANCELLED, "cancelled before it arrived");
  auto out = Collect(*sink);
  EXPECT_TRUE(out[1].tokens.empty());
  EXPECT_EQ(out[2].tokens.size(), 5u);
  EXPECT_EQ(out[2].state, v1::FINISH_STATE_LENGTH);

  // Sequence 3's cancel has expired by the time it comes: it runs.
  clock.Advance(Scheduler::kEarlyCancelTtl + std::chrono::seconds(1));
  v1::Batch late;
  *late.add_sequences() = Seq(3, 4);
  auto sink3 = std::make_shared<Sink>();
  scheduler.Submit(sink3, late);
  ASSERT_TRUE(sink3->WaitFinish().ok());
  EXPECT_EQ(Collect(*sink3)[3].tokens.size(), 4u);
  EXPECT_EQ(Collect(*sink3)[3].state, v1::FINISH_STATE_LENGTH);

  // Bounded: past kMaxEarlyCancels ids the oldest is forgotten first.
  std::vector<uint64_t> many;
  for (uint64_t id = 1000; id <= 1000 + Scheduler::kMaxEarlyCancels; ++id) many.push_back(id);
  std::promise<int> none;
  scheduler.Cancel(many, [&](int n) { none.set_value(n); });
  EXPECT_EQ(none.get_future().get(), 0);
  v1::Batch ends;
  *ends.add_sequences() = Seq(1000, 2);
  *ends.add_sequences() = Seq(1000 + Scheduler::kMaxEarlyCancels, 2);
  auto sink4 = std::make_shared<Sink>();
  scheduler.Submit(sink4, ends);
  ASSERT_TRUE(sink4->WaitFinish().ok());
  auto last = Collect(*sink4);
  EXPECT_EQ(last[1000].state, v1::FINISH_STATE_LENGTH);
  EXPECT_EQ(last[1000 + Scheduler::kMaxEarlyCancels].state, v1::FINISH_STATE_CANCELLED);
  scheduler.Stop();
}

TEST(SimEngineTest, CostModel) {
  SimBackendConfig c;
  c.step_base_ms = 4;
  c.step_per_sequence_ms = 0.02;
  c.step_per_kv_token_ns = 15;
  c.step_per_prefill_token_ms = 0.03;
  EXPECT_NEAR(SimStepSeconds(c, 16, 16 * 512, 0), 0.004 + 0.00032 + 0.00012288, 1e-12);
  EXPECT_NEAR(SimStepSeconds(c, 1, 100, 100), 0.004 + 0.00002 + 0.0000015 + 0.003, 1e-12);

  FakeClock clock;
  std::vector<SteadyTime> sleeps;
  SimEngine engine(c, "m", clock, [&](SteadyTime t) { sleeps.push_back(t); });
  std::vector<int32_t> prompt(100, 1), running(200, 1), next;
  Sampling s;
  std::vector<StepSequence> batch = {{1, &prompt, 100, 0, &s}, {2, &running, 50, 199, &s}};
  ASSERT_TRUE(engine.Step(batch, &next).ok());
  ASSERT_EQ(sleeps.size(), 1u);
  // kv = 300 tokens, prefill = 100 (only the new sequence), batch 2.
  const double expected = 0.004 + 2 * 0.00002 + 300 * 15e-9 + 100 * 0.00003;
  EXPECT_NEAR(Seconds(sleeps[0] - clock.Now()), expected, 1e-9);
  EXPECT_EQ(next[1], SimToken(0, 150, 256));
}

}  // namespace
}  // namespace tailserve

namespace tailserve {
namespace {

// The simulator with a model's EOS ids and context length, as a real backend reports them.
class ModelLikeEngine final : public Engine {
 public:
  ModelLikeEngine(std::vector<int32_t> eos, int32_t context) : sim_(FreeSim(), "m"), eos_(std::move(eos)), context_(context) {}
  std::string backend() const override { return "test"; }
  std::string model_id() const override { return "m"; }
  bool simulated() const override { return false; }
  int32_t vocab_size() const override { return sim_.vocab_size(); }
  int32_t max_context() const override { return context_; }
  std::vector<int32_t> eos_token_ids() const override { return eos_; }
  absl::Status Step(std::span<const StepSequence> b, std::vector<int32_t>* next) override {
    if (fail_from_step >= 0 && steps_++ >= fail_from_step) return absl::InternalError("device fault: illegal address");
    return sim_.Step(b, next);
  }
  // A KV cache of `capacity` tokens (0: unlimited), like the CUDA engine's: a sequence longer than
  // the whole cache is invalid, one that does not fit now must wait.
  absl::Status Reserve(uint64_t id, int64_t tokens) override {
    if (capacity > 0 && tokens > capacity) return absl::InvalidArgumentError("longer than the whole KV cache");
    if (capacity > 0 && held_ + tokens > capacity) return absl::ResourceExhaustedError("KV cache: no room");
    reserved_[id] = tokens;
    held_ += tokens;
    return absl::OkStatus();
  }
  void Release(uint64_t id) override {
    sim_.Release(id);
    if (auto it = reserved_.find(id); it != reserved_.end()) held_ -= it->second, reserved_.erase(it);
  }
  int64_t held() const { return held_; }
  int64_t capacity = 0;
  int fail_from_step = -1;  // steps from this one on fail (-1: none)

 private:
  int steps_ = 0;
  std::map<uint64_t, int64_t> reserved_;
  int64_t held_ = 0;
  SimEngine sim_;
  std::vector<int32_t> eos_;
  int32_t context_;
};

// A started scheduler over a ModelLikeEngine, with its metrics.
struct ModelScheduler {
  ModelScheduler(Engine& engine, int slots) : metrics(registry, 60), scheduler(engine, slots, metrics) {
    scheduler.Start();
  }
  Registry registry;
  WorkerMetrics metrics;
  Scheduler scheduler;
};

TEST(SchedulerModelTest, EosFromTheModelStopsAndContextCapsLength) {
  const int32_t eos = SimToken(7, 3, 1000);
  ModelLikeEngine engine({eos}, /*context=*/12);
  ModelScheduler running(engine, 4);
  Scheduler& scheduler = running.scheduler;

  auto sink = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 50, 7);   // its 4th token is the model's EOS
  *b.add_sequences() = Seq(2, 50, 99);  // never (checked below) meets EOS: the 12-token context ends it
  scheduler.Submit(sink, b);
  ASSERT_TRUE(sink->WaitFinish().ok());
  auto out = Collect(*sink);
  int first_eos = 0;
  while (SimToken(7, first_eos, 1000) != eos) ++first_eos;
  EXPECT_EQ(out[1].state, v1::FINISH_STATE_STOP);
  EXPECT_EQ(out[1].tokens.size(), static_cast<size_t>(first_eos + 1));
  for (int i = 0; i < 9; ++i) ASSERT_NE(SimToken(99, i, 1000), eos);
  EXPECT_EQ(out[2].state, v1::FINISH_STATE_LENGTH);
  EXPECT_EQ(out[2].tokens.size(), 9u);  // 3 prompt + 9 generated = the context of 12

  // A prompt that fills the context is refused, naming it.
  auto refused = std::make_shared<Sink>();
  v1::Batch big;
  *big.add_sequences() = Seq(3, 5);
  for (int i = 0; i < 9; ++i) big.mutable_sequences(0)->add_prompt_token_ids(1);
  scheduler.Submit(refused, big);
  EXPECT_TRUE(refused->WaitFinish().ok());
  ASSERT_EQ(refused->messages().size(), 1u);
  EXPECT_EQ(refused->messages()[0].sequences(0).state(), v1::FINISH_STATE_INVALID);
  EXPECT_EQ(refused->messages()[0].sequences(0).error(), "12 tokens leave no room in the model's context of 12 tokens");
  scheduler.Stop();
}

TEST(SchedulerModelTest, KvReservationTurnsAwayWhatDoesNotFitUntilRoomIsFreed) {
  ModelLikeEngine engine({}, /*context=*/1000);
  engine.capacity = 30;  // tokens
  ModelScheduler running(engine, 8);
  Scheduler& scheduler = running.scheduler;
  WorkerMetrics& metrics = running.metrics;
  // Both batches must reach the scheduler in one drain of its commands: with free steps the first
  // could otherwise finish before the second is admitted (it did, once, on a loaded CI machine).
  // A command that blocks holds the scheduler thread while they queue.
  std::promise<void> holding, release;
  std::shared_future<void> released = release.get_future().share();
  scheduler.Cancel({}, [&holding, released](int) {
    holding.set_value();
    released.wait();
  });
  holding.get_future().wait();
  auto first = std::make_shared<Sink>();
  v1::Batch b;
  *b.add_sequences() = Seq(1, 10);  // 3 prompt + 10 = 13 tokens
  *b.add_sequences() = Seq(2, 10);  // 26 held
  scheduler.Submit(first, b);
  auto second = std::make_shared<Sink>();
  v1::Batch c;
  *c.add_sequences() = Seq(3, 10);  // 13 more would be 39 > 30
  scheduler.Submit(second, c);
  release.set_value();
  const grpc::Status s = second->WaitFinish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "KV cache: no room");
  EXPECT_EQ(metrics.batches.Labels({"rejected_kv"}).Value(), 1);
  ASSERT_TRUE(first->WaitFinish().ok());
  auto third = std::make_shared<Sink>();
  scheduler.Submit(third, c);  // the first batch's room is back
  EXPECT_TRUE(third->WaitFinish().ok());
  // Longer than the whole cache: no worker of this kind can run it, so not RESOURCE_EXHAUSTED
  // (which a router retries) but refused alone; its batch mate runs.
  auto never = std::make_shared<Sink>();
  v1::Batch d;
  *d.add_sequences() = Seq(4, 40);
  *d.add_sequences() = Seq(5, 3);
  scheduler.Submit(never, d);
  EXPECT_TRUE(never->WaitFinish().ok());
  auto out = Collect(*never);
  EXPECT_EQ(out[4].state, v1::FINISH_STATE_INVALID);
  EXPECT_EQ(never->messages()[0].sequences(0).error(), "longer than the whole KV cache");
  EXPECT_EQ(out[5].state, v1::FINISH_STATE_LENGTH);
  EXPECT_EQ(metrics.sequences.Labels({"invalid"}).Value(), 1);
  EXPECT_EQ(engine.held(), 0);
  scheduler.Stop();
}

TEST(SchedulerModelTest, FailedEngineStepHandsSequencesBackAndTurnsNewBatchesAway) {
  ModelLikeEngine engine({}, /*context=*/1000);
  engine.fail_from_step = 2;  // the prefill and one decode step run, the third step fails
  Registry registry;
  WorkerMetrics metrics(registry, 60);
  Scheduler scheduler(engine, 4, metrics);
  auto sink = std::make_shared<Sink>();
  std::promise<std::pair<absl::Status, size_t>> failed;  // the error, and the sink's events by then
  scheduler.OnEngineFailure([&](const absl::Status& s) { failed.set_value({s, sink->messages().size()}); });
  scheduler.Start();
  EXPECT_TRUE(scheduler.EngineHealth().ok());

  v1::Batch b;
  *b.add_sequences() = Seq(1, 10);
  *b.add_sequences() = Seq(2, 10);
  scheduler.Submit(sink, b);
  // Handed back as at shutdown: the stream ends UNAVAILABLE after the tokens of the steps that
  // ran, which a router re-dispatches from.
  const grpc::Status ended = sink->WaitFinish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ended.error_message(), "engine failed: device fault: illegal address");
  auto out = Collect(*sink);
  for (uint64_t id : {1, 2}) {
    EXPECT_EQ(out[id].state, v1::FINISH_STATE_RUNNING) << id;
    EXPECT_EQ(out[id].tokens.size(), 2u) << id;
  }
  auto [status, events_before] = failed.get_future().get();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(events_before, 2u);
  EXPECT_EQ(scheduler.EngineHealth().message(), "device fault: illegal address");
  EXPECT_EQ(engine.held(), 0);  // the failed sequences' KV is released
  EXPECT_EQ(sink->finishes(), 1);  // one end, UNAVAILABLE, not a second OK after it

  // New work is turned away with UNAVAILABLE, which a router re-dispatches to another worker.
  auto later = std::make_shared<Sink>();
  scheduler.Submit(later, b);
  const grpc::Status s = later->WaitFinish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.error_message(), "engine failed: device fault: illegal address");
  EXPECT_EQ(metrics.batches.Labels({"rejected_engine_failed"}).Value(), 1);
  EXPECT_TRUE(later->messages().empty());
  scheduler.Stop();
}

}  // namespace
}  // namespace tailserve

namespace tailserve {
namespace {

// A sim engine that records, each step, the tokens it computed for each sequence.
class CountingEngine final : public Engine {
 public:
  explicit CountingEngine(SimEngine& inner) : inner_(inner) {}
  std::string backend() const override { return "sim"; }
  std::string model_id() const override { return "test"; }
  bool simulated() const override { return true; }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  absl::Status Step(std::span<const StepSequence> batch, std::vector<int32_t>* next) override {
    std::map<uint64_t, int64_t> step;
    for (const StepSequence& s : batch) step[s.id] = s.computed_after() - s.computed;
    {
      std::lock_guard lock(mu_);
      steps_.push_back(std::move(step));
    }
    return inner_.Step(batch, next);
  }
  void Release(uint64_t id) override { inner_.Release(id); }
  std::vector<std::map<uint64_t, int64_t>> steps() const {
    std::lock_guard lock(mu_);
    return steps_;
  }

 private:
  SimEngine& inner_;
  mutable std::mutex mu_;
  std::vector<std::map<uint64_t, int64_t>> steps_;
};

v1::Sequence LongSeq(uint64_t id, int prompt_tokens, int max_tokens) {
  v1::Sequence s = Seq(id, max_tokens);
  s.clear_prompt_token_ids();
  for (int t = 0; t < prompt_tokens; ++t) s.add_prompt_token_ids(5 + t % 50);
  return s;
}

// With a step-token budget of 32: two short prompts and a 100-token one admitted together. Step 1
// computes the short prompts (3 + 3) and the first 26 of the long one; then each step the shorts
// decode (1 + 1) and the long one takes the other 30, until its last 14 tokens fit and it samples
// its first token in step 4. No step computes more than the budget; the shorts' tokens are the
// ones they get without a budget (the same seeds), and so are the long one's.
TEST(SchedulerBudgetTest, LongPromptsRunInChunksBesideTheDecodes) {
  SimEngine sim(FreeSim(), "test");
  for (int budget : {0, 32}) {
    CountingEngine engine(sim);
    Registry registry;
    WorkerMetrics metrics(registry, 60);
    Scheduler scheduler(engine, 4, metrics);
    scheduler.SetStepTokenBudget(budget);
    scheduler.Start();
    auto sink = std::make_shared<Sink>();
    v1::Batch b;
    *b.add_sequences() = Seq(1, 6, 11);
    *b.add_sequences() = Seq(2, 6, 12);
    *b.add_sequences() = LongSeq(3, 100, 3);
    scheduler.Submit(sink, b);
    ASSERT_TRUE(sink->WaitFinish().ok());
    auto out = Collect(*sink);
    ASSERT_EQ(out[1].tokens.size(), 6u) << budget;
    ASSERT_EQ(out[2].tokens.size(), 6u) << budget;
    ASSERT_EQ(out[3].tokens.size(), 3u) << budget;
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out[1].tokens[i], SimToken(11, i, 1000)) << budget;
    const auto steps = engine.steps();
    if (budget == 0) {
      EXPECT_EQ(steps.front().at(3), 100);  // the whole prompt in the first step
      continue;
    }
    ASSERT_GE(steps.size(), 4u);
    EXPECT_EQ(steps[0], (std::map<uint64_t, int64_t>{{1, 3}, {2, 3}, {3, 26}}));
    EXPECT_EQ(steps[1], (std::map<uint64_t, int64_t>{{1, 1}, {2, 1}, {3, 30}}));
    EXPECT_EQ(steps[2], (std::map<uint64_t, int64_t>{{1, 1}, {2, 1}, {3, 30}}));
    EXPECT_EQ(steps[3], (std::map<uint64_t, int64_t>{{1, 1}, {2, 1}, {3, 14}}));
    for (const auto& step : steps) {
      int64_t total = 0;
      for (const auto& [id, n] : step) total += n;
      EXPECT_LE(total, budget);
    }
    // The long prompt's first token came with the shorts' fourth.
    int short_tokens_before = 0;
    for (const auto& ev : sink->messages()) {
      bool long_started = false;
      for (const auto& se : ev.sequences()) {
        if (se.sequence_id() == 3 && se.token_ids_size() > 0) long_started = true;
        if (se.sequence_id() == 1) short_tokens_before += se.token_ids_size();
      }
      if (long_started) break;
    }
    EXPECT_EQ(short_tokens_before, 4);
  }
}

// More prompts than one step's budget holds: the later ones wait whole steps, in admission order,
// and every prompt still completes.
TEST(SchedulerBudgetTest, PromptsPastTheBudgetWaitTheirTurnInOrder) {
  SimEngine sim(FreeSim(), "test");
  CountingEngine engine(sim);
  Registry registry;
  WorkerMetrics metrics(registry, 60);
  Scheduler scheduler(engine, 4, metrics);
  scheduler.SetStepTokenBudget(8);
  scheduler.Start();
  auto sink = std::make_shared<Sink>();
  v1::Batch b;
  for (uint64_t id = 1; id <= 4; ++id) *b.add_sequences() = LongSeq(id, 10, 2);
  scheduler.Submit(sink, b);
  ASSERT_TRUE(sink->WaitFinish().ok());
  auto out = Collect(*sink);
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(out[id].tokens.size(), 2u) << id;
  const auto steps = engine.steps();
  ASSERT_GE(steps.size(), 2u);
  EXPECT_EQ(steps[0], (std::map<uint64_t, int64_t>{{1, 8}}));  // prompt 1's first 8 tokens only
  EXPECT_EQ(steps[1], (std::map<uint64_t, int64_t>{{1, 2}, {2, 6}}));
  for (const auto& step : steps) {
    int64_t total = 0;
    for (const auto& [id, n] : step) total += n;
    EXPECT_LE(total, 8);
  }
}

}  // namespace
}  // namespace tailserve
