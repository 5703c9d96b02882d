#include "worker/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace tailserve {

Scheduler::Scheduler(Engine& engine, int slots, WorkerMetrics& metrics, const Clock& clock)
    : engine_(engine), eos_ids_(engine.eos_token_ids()), slots_(slots), metrics_(metrics), clock_(clock) {
  metrics_.total_slots.Set(slots_);
  PublishSnapshot();
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() { thread_ = std::thread([this] { Loop(); }); }

void Scheduler::Stop() {
  if (!thread_.joinable()) return;
  commands_.Post([this] { stopping_ = true; });
  thread_.join();
  // Commands that raced with the stop, or come after it, still get their answer (UNAVAILABLE, or
  // 0 cancelled).
  commands_.Close();
}

void Scheduler::Submit(std::shared_ptr<BatchSink> sink, v1::Batch batch) {
  commands_.Post([this, sink = std::move(sink), batch = std::move(batch)]() mutable {
    Admit(std::move(sink), std::move(batch));
  });
}

void Scheduler::CancelSink(std::shared_ptr<BatchSink> sink) {
  commands_.Post([this, sink = std::move(sink)] {
    for (size_t i = running_.size(); i-- > 0;) {
      if (running_[i].sink == sink) Retire(i, "cancelled");
    }
    for (size_t i = waiting_.size(); i-- > 0;) {
      if (waiting_[i].sink == sink) RetireWaiting(i, "cancelled");
    }
    PublishCounts();
  });
}

void Scheduler::Cancel(std::vector<uint64_t> ids, std::function<void(int)> done) {
  commands_.Post([this, ids = std::move(ids), done = std::move(done)] {
    int n = 0;
    for (uint64_t id : ids) {
      bool found = false;
      for (std::vector<Slot>* list : {&running_, &waiting_}) {
        const auto it = std::find_if(list->begin(), list->end(), [id](const Slot& s) { return s.id == id; });
        if (it == list->end()) continue;
        found = true;
        const bool running = list == &running_;
        v1::TokenEvent ev;
        // What is free once it is gone: a router reads every event's free_slots, and 0 here
        // made an idle worker look full until its next Status poll.
        SetLoad(ev, slots_ - static_cast<int>(running_.size()) + (running ? 1 : 0));
        auto* se = ev.add_sequences();
        se->set_sequence_id(id);
        se->set_state(v1::FINISH_STATE_CANCELLED);
        it->sink->Write(std::move(ev));  // before its stream can end
        const size_t index = static_cast<size_t>(it - list->begin());
        running ? Retire(index, "cancelled") : RetireWaiting(index, "cancelled");
        ++n;
        break;
      }
      if (!found) RememberEarlyCancel(id);
    }
    PublishCounts();
    done(n);
  });
}

void Scheduler::RememberEarlyCancel(uint64_t id) {
  const SteadyTime now = clock_.Now();
  // Oldest first: drop what has expired, and past the cap the oldest (O(1) a cancel).
  while (!early_order_.empty() &&
         (now - early_order_.front().second > kEarlyCancelTtl || early_order_.size() >= kMaxEarlyCancels)) {
    const auto [old_id, at] = early_order_.front();
    early_order_.pop_front();
    if (auto it = early_cancels_.find(old_id); it != early_cancels_.end() && it->second == at) early_cancels_.erase(it);
  }
  early_cancels_[id] = now;
  early_order_.emplace_back(id, now);
}

void Scheduler::OnEngineFailure(std::function<void(const absl::Status&)> handler) {
  on_engine_failure_ = std::move(handler);
}

absl::Status Scheduler::EngineHealth() const {
  std::lock_guard lock(snapshot_mu_);
  return engine_failure_;
}

void Scheduler::SetPolicy(const SchedulingPolicy& policy, int max_waiting) {
  policy_ = policy;
  max_waiting_ = max_waiting;
}

WorkItem Scheduler::ItemOf(const Slot& s) const {
  WorkItem w;
  w.arrival = s.arrival;
  w.priority = s.priority;
  w.uncached_tokens = static_cast<int64_t>(s.tokens.size()) - s.computed;
  w.generated = static_cast<int32_t>(s.tokens.size()) - s.prompt_len;
  w.max_tokens = s.max_tokens;
  w.predicted_steps = s.predicted_steps;
  w.admitted = s.admitted;
  w.ttft_slo = s.ttft_slo;
  return w;
}

void Scheduler::SetLoad(v1::TokenEvent& ev, int free_slots, const QueueLoad& load) const {
  ev.set_simulated(engine_.simulated());
  ev.set_free_slots(free_slots);
  ev.set_waiting_sequences(load.waiting);
  ev.set_queued_prefill_tokens(load.prefill_tokens);
  ev.set_prefilling_sequences(load.prefilling);
}

Scheduler::QueueLoad Scheduler::CurrentLoad() const {
  QueueLoad load;
  load.waiting = static_cast<int>(waiting_.size());
  for (const std::vector<Slot>* list : {&waiting_, &running_}) {
    for (const Slot& s : *list) {
      const int64_t uncached = static_cast<int64_t>(s.tokens.size()) - s.computed;
      if (uncached <= 1) continue;
      load.prefill_tokens += uncached;
      if (list == &running_) ++load.prefilling;
    }
  }
  return load;
}

SchedulerSnapshot Scheduler::Snapshot() const {
  std::lock_guard lock(snapshot_mu_);
  return snapshot_;
}

void Scheduler::Retire(size_t index, const char* reason) {
  Slot slot = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  Finished(std::move(slot), reason);
}

void Scheduler::RetireWaiting(size_t index, const char* reason) {
  Slot slot = std::move(waiting_[index]);
  waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(index));
  Finished(std::move(slot), reason);
}

void Scheduler::Finished(Slot slot, const char* reason) {
  engine_.Release(slot.id);
  if (reason != nullptr) metrics_.sequences.Labels({reason}).Inc();
  // Counts first: a router that sees the stream end and then asks Status finds the slot free.
  PublishCounts();
  auto it = open_per_sink_.find(slot.sink.get());
  if (it != open_per_sink_.end() && --it->second == 0) {
    open_per_sink_.erase(it);
    slot.sink->Finish(grpc::Status::OK);
  }
}

void Scheduler::RunStep() {
  // The step carries every decoding sequence, and the prefills (in the admission policy's order)
  // while the step-token budget lasts: a prompt that does not fit runs a chunk and continues next
  // step, so a burst of long prompts never stalls the decodes for a whole prefill. No budget: all
  // of them.
  int64_t budget = policy_.step_token_budget;
  std::vector<StepSequence> batch;
  std::vector<size_t> slot_of;  // batch[k] is running_[slot_of[k]]
  batch.reserve(running_.size());
  std::vector<size_t> prefills;
  int64_t decode_kv = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Slot& s = running_[i];
    if (static_cast<int64_t>(s.tokens.size()) - s.computed > 1) {
      prefills.push_back(i);
      continue;
    }
    batch.push_back(StepSequence{s.id, &s.tokens, s.prompt_len, s.computed, &s.sampling});
    slot_of.push_back(i);
    decode_kv += static_cast<int64_t>(s.tokens.size());
  }
  const int decodes = static_cast<int>(batch.size());
  // A step-time target: the prefill tokens the learned cost says fit it, the budget a floor. The
  // step is costed as if every waiting prompt joined it with its cached part (an overestimate when
  // the room runs out first), so it stays within the target.
  if (policy_.step_time_target > 0 && !prefills.empty()) {
    int64_t cached = decode_kv;
    for (size_t i : prefills) cached += running_[i].computed;
    const int sequences = decodes + static_cast<int>(prefills.size());
    if (const std::optional<int64_t> room =
            step_cost_.PrefillTokensWithin(policy_.step_time_target, sequences, cached)) {
      budget = std::max<int64_t>(budget, decodes + std::max<int64_t>(*room, 1));
    }
  }
  // A prefill token against a decode step of one sequence, for the predicted order's work.
  if (const std::optional<StepCostModel::Fit> f = step_cost_.fit(); f && decodes > 0) {
    const double per_sequence_step = (f->a + f->b * decodes + f->c * static_cast<double>(decode_kv)) / decodes;
    if (per_sequence_step > 0 && f->p + f->c > 0) policy_.prefill_token_weight = (f->p + f->c) / per_sequence_step;
  }
  const bool budgeted = budget > 0;
  int64_t left = budget - decodes;  // the decodes come out of it first
  if (budgeted && prefills.size() > 1) {
    const SteadyTime now = clock_.Now();
    std::stable_sort(prefills.begin(), prefills.end(), [&](size_t a, size_t b) {
      return AdmitsBefore(ItemOf(running_[a]), ItemOf(running_[b]), policy_, now);
    });
  }
  int64_t prefill = 0;
  for (size_t i : prefills) {
    if (budgeted && left <= 0) break;  // the rest wait for the next step's budget
    Slot& s = running_[i];
    StepSequence seq{s.id, &s.tokens, s.prompt_len, s.computed, &s.sampling};
    const int64_t uncached = static_cast<int64_t>(s.tokens.size()) - s.computed;
    if (budgeted && uncached > left) seq.end = s.computed + static_cast<int32_t>(left);
    const int64_t taken = seq.computed_after() - s.computed;
    prefill += taken;
    if (budgeted) left -= taken;
    batch.push_back(seq);
    slot_of.push_back(i);
  }
  if (batch.empty()) return;
  std::vector<TokenLogprobs> logprobs;  // sized only in a step where some sequence asks
  for (size_t k = 0; k < batch.size(); ++k) {
    if (batch[k].chunk() || batch[k].sampling->top_logprobs < 0) continue;
    if (logprobs.empty()) logprobs.resize(batch.size());
    batch[k].logprobs = &logprobs[k];
  }
  std::vector<int32_t> next;
  const SteadyTime start = clock_.Now();
  const absl::Status status = engine_.Step(batch, &next);
  const double seconds = Seconds(clock_.Now() - start);
  metrics_.step_time.Observe(seconds);
  metrics_.step_time_window.Observe(seconds);
  metrics_.step_batch_size.Observe(static_cast<double>(batch.size()));
  metrics_.prefill_tokens.Inc(static_cast<double>(prefill));
  metrics_.step_prefill_tokens.Observe(static_cast<double>(prefill));
  if (status.ok()) {
    int64_t kv = 0;
    for (const StepSequence& seq : batch) kv += seq.computed_after();
    step_cost_.Observe(static_cast<int>(batch.size()), kv, prefill, seconds);
    if (const std::optional<StepCostModel::Fit> f = step_cost_.fit()) {
      metrics_.step_cost.Labels({"base"}).Set(f->a);
      metrics_.step_cost.Labels({"per_sequence"}).Set(f->b);
      metrics_.step_cost.Labels({"per_kv_token"}).Set(f->c);
      metrics_.step_cost.Labels({"per_prefill_token"}).Set(f->p);
    }
  }
  if (const std::optional<EngineStats> stats = engine_.stats()) metrics_.Publish(*stats);
  if (!status.ok()) {
    // A device fault, not a request's (requests are validated at admission): every running
    // sequence goes back, as at shutdown, for a router to continue on another worker from the
    // tokens it has, and new work is turned away from now on.
    spdlog::critical("engine step failed, handing back {} sequences and turning new work away: {}", running_.size(),
                     status.ToString());
    {
      std::lock_guard lock(snapshot_mu_);
      engine_failure_ = status;
    }
    if (on_engine_failure_) on_engine_failure_(status);
    HandBackAll(grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("engine failed: ", status.message())), "error");
    return;
  }

  std::map<BatchSink*, v1::TokenEvent> events;
  std::vector<std::pair<size_t, const char*>> retire;
  for (size_t k = 0; k < batch.size(); ++k) {
    const size_t i = slot_of[k];
    Slot& s = running_[i];
    if (batch[k].chunk()) {  // a prefill chunk: in the cache now, no token yet
      s.computed = batch[k].end;
      continue;
    }
    v1::TokenEvent& ev = events[s.sink.get()];
    auto* se = ev.add_sequences();
    se->set_sequence_id(s.id);
    if (s.cached > 0) se->set_cached_tokens(s.cached);
    const int32_t token = next[k];
    s.tokens.push_back(token);
    s.computed = static_cast<int32_t>(s.tokens.size()) - 1;
    ++s.steps;
    se->add_token_ids(token);
    if (batch[k].logprobs) {
      v1::TokenLogprob* lp = se->add_logprobs();
      lp->set_logprob(logprobs[k].logprob);
      for (const auto& [id, l] : logprobs[k].top) lp->add_top_token_ids(id), lp->add_top_logprobs(l);
    }
    metrics_.generated_tokens.Inc();
    const int32_t generated = static_cast<int32_t>(s.tokens.size()) - s.prompt_len;
    if (s.stop_ids.count(token)) {
      se->set_state(v1::FINISH_STATE_STOP);
      retire.emplace_back(i, "stop");
    } else if (generated >= s.max_tokens || static_cast<int64_t>(s.tokens.size()) >= engine_.max_context()) {
      se->set_state(v1::FINISH_STATE_LENGTH);
      retire.emplace_back(i, "length");
    } else if (s.budget > 0 && s.steps >= s.budget) {
      se->set_state(v1::FINISH_STATE_BUDGET_EXHAUSTED);
      retire.emplace_back(i, "budget");
    }
  }
  const int free_after = slots_ - static_cast<int>(running_.size() - retire.size());
  const QueueLoad load = CurrentLoad();  // once, not once a sink
  for (auto& [sink, ev] : events) SetLoad(ev, free_after, load);
  // Write events before retiring so each sink sees its last tokens before it finishes.
  for (size_t i = 0; i < running_.size(); ++i) {
    auto it = events.find(running_[i].sink.get());
    if (it != events.end()) {
      running_[i].sink->Write(std::move(it->second));
      events.erase(it);
    }
  }
  for (size_t k = retire.size(); k-- > 0;) Retire(retire[k].first, retire[k].second);
}

void Scheduler::HandBackAll(const grpc::Status& status, const char* reason) {
  // Each stream ends once, with `status` (UNAVAILABLE: the router re-dispatches its sequences),
  // after every sequence's KV is released: out of open_per_sink_ first, so Retire does not end it OK.
  std::vector<std::shared_ptr<BatchSink>> sinks;
  for (const std::vector<Slot>* list : {&running_, &waiting_}) {
    for (const Slot& s : *list) {
      if (open_per_sink_.erase(s.sink.get())) sinks.push_back(s.sink);
    }
  }
  for (size_t i = running_.size(); i-- > 0;) Retire(i, reason);
  for (size_t i = waiting_.size(); i-- > 0;) RetireWaiting(i, reason);
  for (auto& sink : sinks) sink->Finish(status);
}

void Scheduler::PublishCounts() {
  const int running = static_cast<int>(running_.size());
  metrics_.running_sequences.Set(running);
  metrics_.free_slots.Set(slots_ - running);
  metrics_.waiting_sequences.Set(static_cast<double>(waiting_.size()));
  const QueueLoad load = CurrentLoad();
  std::lock_guard lock(snapshot_mu_);
  snapshot_.total_slots = slots_;
  snapshot_.free_slots = slots_ - running;
  snapshot_.running = running;
  snapshot_.waiting = static_cast<int>(waiting_.size());
  snapshot_.max_waiting = max_waiting_;
  snapshot_.queued_prefill_tokens = load.prefill_tokens;
  snapshot_.prefilling = load.prefilling;
  snapshot_.step_token_budget = policy_.step_token_budget;
}

void Scheduler::PublishSnapshot() {
  PublishCounts();
  const auto q = metrics_.step_time_window.Read({0.5, 0.95});
  std::lock_guard lock(snapshot_mu_);
  snapshot_.step_p50_seconds = q.count ? q.quantiles[0] : 0;
  snapshot_.step_p95_seconds = q.count ? q.quantiles[1] : 0;
}

void Scheduler::Loop() {
  int steps_since_publish = 0;
  while (true) {
    auto cmds = running_.empty() && waiting_.empty() ? commands_.TakeAll(std::nullopt) : commands_.TryTakeAll();
    for (auto& c : cmds) c();
    if (stopping_) {
      HandBackAll(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down"), "cancelled");
      PublishSnapshot();
      return;
    }
    AdmitWaiting();
    EnsureKv();
    if (running_.empty()) continue;
    RunStep();
    // The window quantiles sort their samples: refresh the snapshot every few steps, not every one.
    if (++steps_since_publish >= 16 || running_.empty()) {
      steps_since_publish = 0;
      PublishSnapshot();
    } else {
      PublishCounts();
    }
  }
}

}  // namespace tailserve
