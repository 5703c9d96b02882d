// The scheduler's admission half: validating and accepting a batch (Submit's command), moving
// waiting sequences into slots in the policy's order, growing KV promises and preempting when the
// cache runs out. Same class and owner thread as scheduler.cc; split off to keep each file to one job.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "proto/sampling_checks.h"
#include "worker/scheduler.h"  // the class both halves define

namespace tailserve {
namespace {

static_assert(kMaxTopLogprobs == kMaxTopLogprobsRequest, "the engines return as many alternatives as a request may ask");

Sampling ToSampling(const v1::SamplingParams& p) {
  Sampling s;
  s.temperature = p.temperature();
  s.top_p = p.top_p() > 0 ? p.top_p() : 1.0f;
  s.top_k = p.top_k();
  s.seed = p.has_seed() ? p.seed() : 0;
  s.top_logprobs = p.logprobs() ? p.top_logprobs() : -1;
  return s;
}

}  // namespace

absl::Status Scheduler::ValidateSequence(const v1::Sequence& s, std::unordered_set<uint64_t>& ids) const {
  if (!ids.insert(s.sequence_id()).second) {
    return absl::AlreadyExistsError(absl::StrCat("sequence_id: ", s.sequence_id(), " is already running"));
  }
  if (s.prompt_token_ids().empty()) return absl::InvalidArgumentError("prompt_token_ids: empty");
  const int32_t vocab = engine_.vocab_size();
  for (auto* list : {&s.prompt_token_ids(), &s.generated_token_ids()}) {
    for (int32_t t : *list) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " outside the vocabulary [0, ", vocab, ")"));
      }
    }
  }
  const int64_t length = static_cast<int64_t>(s.prompt_token_ids_size()) + s.generated_token_ids_size();
  if (length >= engine_.max_context()) {
    return absl::InvalidArgumentError(absl::StrCat(length, " tokens leave no room in the model's context of ",
                                                   engine_.max_context(), " tokens"));
  }
  if (s.max_tokens() <= s.generated_token_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: ", s.max_tokens(), " leaves nothing to generate after ",
                                                   s.generated_token_ids_size(), " tokens"));
  }
  if (s.step_budget() < 0) return absl::InvalidArgumentError("step_budget: must be >= 0");
  // The router checks these too; a worker checks what reaches its port, whoever sent it.
  TAILSERVE_RETURN_IF_ERROR(CheckSamplingParams(s.sampling()));
  return absl::OkStatus();
}

void Scheduler::Admit(std::shared_ptr<BatchSink> sink, v1::Batch batch) {
  if (stopping_) {
    sink->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down"));
    return;
  }
  if (absl::Status failure = EngineHealth(); !failure.ok()) {
    metrics_.batches.Labels({"rejected_engine_failed"}).Inc();
    sink->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("engine failed: ", failure.message())));
    return;
  }
  if (batch.sequences().empty()) {
    metrics_.batches.Labels({"invalid"}).Inc();
    sink->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "sequences: batch is empty"));
    return;
  }
  // A sequence no worker of this kind can run is refused alone, with a FINISH_STATE_INVALID event
  // saying why; its batch mates run.
  v1::TokenEvent refused;
  auto refuse = [&](const v1::Sequence& s, const absl::Status& why) {
    auto* se = refused.add_sequences();
    se->set_sequence_id(s.sequence_id());
    // Its id already running here is a conflict, not the request's fault: handed back (CANCELLED)
    // for the router to run elsewhere. One cancelled before it arrived ends CANCELLED too (its
    // router has dropped it). Anything else no worker of this kind can run.
    const bool handed_back = why.code() == absl::StatusCode::kAlreadyExists || why.code() == absl::StatusCode::kCancelled;
    se->set_state(handed_back ? v1::FINISH_STATE_CANCELLED : v1::FINISH_STATE_INVALID);
    se->set_error(std::string(why.message()));
  };
  std::unordered_set<uint64_t> ids;
  for (const Slot& s : running_) ids.insert(s.id);
  for (const Slot& s : waiting_) ids.insert(s.id);
  std::vector<int> valid;
  const SteadyTime now = clock_.Now();
  for (int i = 0; i < batch.sequences_size(); ++i) {
    const uint64_t id = batch.sequences(i).sequence_id();
    if (auto early = early_cancels_.find(id); early != early_cancels_.end()) {
      const bool live = now - early->second <= kEarlyCancelTtl;
      early_cancels_.erase(early);
      if (live) {
        refuse(batch.sequences(i), absl::CancelledError("cancelled before it arrived"));
        continue;
      }
    }
    if (absl::Status s = ValidateSequence(batch.sequences(i), ids); !s.ok()) {
      refuse(batch.sequences(i), s);
    } else {
      valid.push_back(i);
    }
  }
  const int free = slots_ - static_cast<int>(running_.size());
  const int room = free + max_waiting_ - static_cast<int>(waiting_.size());
  if (static_cast<int>(valid.size()) > room) {
    metrics_.batches.Labels({"rejected_full"}).Inc();
    sink->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              max_waiting_ == 0
                                  ? absl::StrCat("batch of ", valid.size(), " does not fit ", free, " free slots")
                                  : absl::StrCat("batch of ", valid.size(), " does not fit ", free,
                                                 " free slots and the waiting queue's ", room - free, " places")));
    return;
  }
  auto make_slot = [&](v1::Sequence& s) {
    Slot slot;
    slot.id = s.sequence_id();
    slot.tokens.assign(s.prompt_token_ids().begin(), s.prompt_token_ids().end());
    slot.prompt_len = static_cast<int32_t>(slot.tokens.size());
    slot.tokens.insert(slot.tokens.end(), s.generated_token_ids().begin(), s.generated_token_ids().end());
    slot.max_tokens = s.max_tokens();
    slot.budget = s.step_budget();
    slot.arrival = now - std::chrono::milliseconds(std::max<int64_t>(0, s.waited_ms()));
    slot.queued = now;
    // Interactive 0, standard (or unset) 1, batch 2.
    slot.priority = s.priority() == v1::PRIORITY_INTERACTIVE ? 0 : s.priority() == v1::PRIORITY_BATCH ? 2 : 1;
    slot.predicted_steps = s.predicted_steps();
    slot.ttft_slo = std::chrono::milliseconds(std::max(0, s.ttft_slo_ms()));
    slot.sampling = ToSampling(s.sampling());
    slot.stop_ids.insert(s.stop_token_ids().begin(), s.stop_token_ids().end());
    slot.stop_ids.insert(eos_ids_.begin(), eos_ids_.end());
    slot.sink = sink;
    return slot;
  };
  std::vector<Slot> admitted;
  if (max_waiting_ == 0) {
    // No queue: room in the engine's KV cache for each sequence's reservation now, or the batch
    // goes elsewhere (RESOURCE_EXHAUSTED); a sequence longer than the whole cache is refused alone.
    for (int i : valid) {
      Slot slot = make_slot(*batch.mutable_sequences(i));
      const int64_t want = AdmissionReservation(ItemOf(slot), static_cast<int64_t>(slot.tokens.size()),
                                                engine_.max_context(), policy_);
      absl::Status r = ReserveForAdmission(slot, want);
      if (r.code() == absl::StatusCode::kInvalidArgument) {
        refuse(batch.sequences(i), r);
        continue;
      }
      if (!r.ok()) {
        for (const Slot& a : admitted) engine_.Release(a.id);
        metrics_.batches.Labels({"rejected_kv"}).Inc();
        sink->Finish(ToGrpcStatus(r));
        return;
      }
      slot.reserved = want;
      slot.admitted = ++admissions_;
      admitted.push_back(std::move(slot));
    }
  } else {
    for (int i : valid) admitted.push_back(make_slot(*batch.mutable_sequences(i)));
  }
  if (refused.sequences_size() > 0) {
    for (const auto& se : refused.sequences()) {
      metrics_.sequences.Labels({se.state() == v1::FINISH_STATE_INVALID ? "invalid" : "cancelled"}).Inc();
    }
    SetLoad(refused, max_waiting_ == 0 ? free - static_cast<int>(admitted.size()) : free);
    sink->Write(std::move(refused));
  }
  if (admitted.empty()) {
    metrics_.batches.Labels({"invalid"}).Inc();
    sink->Finish(grpc::Status::OK);
    return;
  }
  metrics_.batches.Labels({"admitted"}).Inc();
  open_per_sink_[sink.get()] += static_cast<int>(admitted.size());
  for (Slot& slot : admitted) (max_waiting_ == 0 ? running_ : waiting_).push_back(std::move(slot));
  PublishCounts();
}

absl::Status Scheduler::ReserveForAdmission(Slot& s, int64_t want) {
  int32_t hit = 0;
  if (s.computed == 0) {
    absl::StatusOr<int32_t> attached = engine_.AttachCachedPrefix(s.id, s.tokens);
    if (!attached.ok()) return attached.status();
    hit = *attached;
  }
  const absl::Status r = engine_.Reserve(s.id, want);
  if (!r.ok()) {
    engine_.Release(s.id);  // the attached blocks go back (cached) until it is admitted
    return r;
  }
  if (s.computed == 0) {
    s.computed = hit;
    s.cached = hit;
    metrics_.prefix_queried_tokens.Inc(static_cast<double>(s.tokens.size()));
    metrics_.prefix_hit_tokens.Inc(static_cast<double>(hit));
  }
  return absl::OkStatus();
}

void Scheduler::AdmitWaiting() {
  if (waiting_.empty() || static_cast<int>(running_.size()) >= slots_) return;  // nothing to order for
  const SteadyTime now = clock_.Now();
  std::stable_sort(waiting_.begin(), waiting_.end(),
                   [&](const Slot& a, const Slot& b) { return AdmitsBefore(ItemOf(a), ItemOf(b), policy_, now); });
  size_t taken = 0;
  while (taken < waiting_.size() && static_cast<int>(running_.size()) < slots_) {
    Slot& s = waiting_[taken];
    const int64_t want =
        AdmissionReservation(ItemOf(s), static_cast<int64_t>(s.tokens.size()), engine_.max_context(), policy_);
    const absl::Status r = ReserveForAdmission(s, want);
    if (!r.ok() && r.code() != absl::StatusCode::kInvalidArgument && !running_.empty()) break;  // waits for KV
    if (!r.ok()) {
      // Longer than the whole cache (or, with nothing running, more than it will ever have free):
      // no worker of this kind can run it.
      v1::TokenEvent ev;
      auto* se = ev.add_sequences();
      se->set_sequence_id(s.id);
      se->set_state(v1::FINISH_STATE_INVALID);
      se->set_error(std::string(r.message()));
      SetLoad(ev, slots_ - static_cast<int>(running_.size()));
      s.sink->Write(std::move(ev));  // before its stream can end
      metrics_.sequences.Labels({"invalid"}).Inc();
      RetireWaiting(taken, nullptr);
      continue;
    }
    s.reserved = want;
    s.admitted = ++admissions_;
    metrics_.queue_wait.Observe(Seconds(now - s.queued));
    running_.push_back(std::move(s));
    ++taken;
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(taken));
}

void Scheduler::EnsureKv() {
  if (policy_.reservation == KvReservation::kMaxTokens) return;  // all promised at admission
  auto need_of = [&](const Slot& s) {
    return std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) + 1, engine_.max_context());
  };
  if (std::none_of(running_.begin(), running_.end(), [&](const Slot& s) { return need_of(s) > s.reserved; })) return;
  const SteadyTime now = clock_.Now();
  // The most important first, so a short cache goes to them and the victims are the others.
  std::vector<std::pair<WorkItem, uint64_t>> order;
  for (const Slot& s : running_) order.emplace_back(ItemOf(s), s.id);
  std::stable_sort(order.begin(), order.end(),
                   [&](const auto& a, const auto& b) { return AdmitsBefore(a.first, b.first, policy_, now); });
  auto index_of = [&](uint64_t id) -> std::optional<size_t> {
    for (size_t i = 0; i < running_.size(); ++i) {
      if (running_[i].id == id) return i;
    }
    return std::nullopt;
  };
  std::vector<WorkItem> items;
  for (const auto& [item, id] : order) {
    while (true) {
      const std::optional<size_t> i = index_of(id);
      if (!i) break;  // preempted for one before it
      Slot& s = running_[*i];
      const int64_t need = need_of(s);
      if (need <= s.reserved) break;
      const absl::Status r = engine_.Reserve(s.id, need);
      if (r.ok()) {
        s.reserved = need;
        break;
      }
      if (r.code() == absl::StatusCode::kInvalidArgument) {  // past the whole cache: no victim helps
        Preempt(*i);  // refused with the engine's reason when admission tries it again
        break;
      }
      items.clear();
      for (const Slot& r : running_) items.push_back(ItemOf(r));
      Preempt(PickVictim(items, policy_, now));
    }
  }
}

void Scheduler::Preempt(size_t index) {
  Slot slot = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  engine_.Release(slot.id);
  slot.computed = 0;  // recomputed from its tokens when admitted again
  slot.reserved = 0;
  slot.queued = clock_.Now();
  metrics_.preemptions.Inc();
  waiting_.push_back(std::move(slot));
}

}  // namespace tailserve
