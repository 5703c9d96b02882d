#pragma once
// The tailserve.v1.Worker gRPC service (callback API): hands work to the scheduler, never blocks.
#include <atomic>

#include "tailserve/v1/worker.grpc.pb.h"
#include "worker/engine/engine.h"
#include "worker/scheduler.h"

namespace tailserve {

class WorkerService final : public v1::Worker::CallbackService {
 public:
  WorkerService(Scheduler& scheduler, const Engine& engine, const std::atomic<bool>& ready)
      : scheduler_(scheduler), engine_(engine), ready_(ready) {}

  grpc::ServerWriteReactor<v1::TokenEvent>* Execute(grpc::CallbackServerContext* ctx, const v1::Batch* batch) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx, const v1::CancelRequest* req,
                                   v1::CancelResponse* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                   v1::WorkerStatus* resp) override;

 private:
  Scheduler& scheduler_;
  const Engine& engine_;
  const std::atomic<bool>& ready_;
};

}  // namespace tailserve
