#pragma once
// The router's view of one worker's RPCs, behind an interface so the core can be tested with fakes.
// Callbacks run on gRPC threads and must only post to the core.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "tailserve/v1/worker.grpc.pb.h"

namespace tailserve {

class ExecuteCall {
 public:
  virtual ~ExecuteCall() = default;
  // Cancels the RPC; on_done then reports CANCELLED (unless it already ended).
  virtual void Cancel() = 0;
};

class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  virtual std::shared_ptr<ExecuteCall> Execute(v1::Batch batch, std::function<void(v1::TokenEvent)> on_event,
                                               std::function<void(grpc::Status)> on_done) = 0;
  virtual void Cancel(std::vector<uint64_t> sequence_ids) = 0;
  // `request` carries the prefix-cache event cursor (kv_events_since / kv_events_epoch).
  virtual void Status(std::chrono::milliseconds timeout, const v1::StatusRequest& request,
                      std::function<void(absl::StatusOr<v1::WorkerStatus>)> done) = 0;
};

// Over a gRPC channel to host:port.
// `credentials`: the channel's (common/tls.h; null: plaintext).
std::unique_ptr<WorkerClient> MakeGrpcWorkerClient(const std::string& address,
                                                   std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

}  // namespace tailserve
