#include "worker/worker_service.h"

#include "common/server_stream.h"
#include "worker/kv/kv_event_log.h"

namespace tailserve {

grpc::ServerWriteReactor<v1::TokenEvent>* WorkerService::Execute(grpc::CallbackServerContext* ctx,
                                                                 const v1::Batch* batch) {
  // The cancel callback needs the handle, which exists only once the stream does. A caller that
  // stops reading for kMaxQueuedSteps steps' events loses the batch, not the worker's memory.
  static constexpr size_t kMaxQueuedSteps = 8192;
  auto holder = std::make_shared<std::weak_ptr<BatchSink>>();
  auto* stream = new ServerStream<v1::TokenEvent>([this, holder] {
    if (auto sink = holder->lock()) scheduler_.CancelSink(std::move(sink));
  }, ctx, kMaxQueuedSteps);
  std::shared_ptr<BatchSink> sink = stream->handle();
  *holder = sink;
  scheduler_.Submit(std::move(sink), *batch);
  return stream;
}

grpc::ServerUnaryReactor* WorkerService::Cancel(grpc::CallbackServerContext* ctx, const v1::CancelRequest* req,
                                                v1::CancelResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  scheduler_.Cancel({req->sequence_ids().begin(), req->sequence_ids().end()}, [reactor, resp](int n) {
    resp->set_cancelled(n);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                                v1::WorkerStatus* resp) {
  if (const KvEventLog* log = engine_.kv_events()) {
    const KvEventLog::Changes c = log->Since(req->kv_events_epoch() == log->epoch() ? req->kv_events_since() : 0);
    v1::KvCacheEvents* ev = resp->mutable_kv_events();
    ev->set_salt(log->salt());
    ev->set_block_size(log->block_size());
    ev->set_next(c.next);
    ev->set_snapshot(c.snapshot);
    ev->set_epoch(log->epoch());
    ev->mutable_stored()->Add(c.stored.begin(), c.stored.end());
    ev->mutable_removed()->Add(c.removed.begin(), c.removed.end());
  }
  const SchedulerSnapshot s = scheduler_.Snapshot();
  resp->set_model_id(engine_.model_id());
  resp->set_backend(engine_.backend());
  resp->set_ready(ready_.load() && scheduler_.EngineHealth().ok());
  resp->set_total_slots(s.total_slots);
  resp->set_free_slots(s.free_slots);
  resp->set_running_sequences(s.running);
  resp->set_waiting_sequences(s.waiting);
  resp->set_queued_prefill_tokens(s.queued_prefill_tokens);
  resp->set_max_waiting(s.max_waiting);
  resp->set_prefilling_sequences(s.prefilling);
  resp->set_step_token_budget(s.step_token_budget);
  resp->set_step_time_p50_seconds(s.step_p50_seconds);
  resp->set_step_time_p95_seconds(s.step_p95_seconds);
  resp->set_vocab_size(engine_.vocab_size());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tailserve
