#include "router/worker_client.h"

#include <mutex>

#include "common/grpc_status.h"

namespace tailserve {
namespace {

// One Execute stream. gRPC owns it until OnDone; the shared Control lets the core cancel it safely
// at any time, before or after that.
class ExecuteReactor final : public grpc::ClientReadReactor<v1::TokenEvent> {
 public:
  struct Control final : ExecuteCall {
    std::mutex mu;
    grpc::ClientContext* ctx = nullptr;
    void Cancel() override {
      std::lock_guard lock(mu);
      if (ctx) ctx->TryCancel();
    }
  };

  // Once StartCall runs, the stream may finish and delete this object at any moment: the caller
  // keeps its own reference to `control` and never touches the reactor again.
  ExecuteReactor(v1::Worker::Stub* stub, v1::Batch batch, std::function<void(v1::TokenEvent)> on_event,
                 std::function<void(grpc::Status)> on_done, std::shared_ptr<Control> control)
      : batch_(std::move(batch)), on_event_(std::move(on_event)), on_done_(std::move(on_done)),
        control_(std::move(control)) {
    control_->ctx = &ctx_;
    stub->async()->Execute(&ctx_, &batch_, this);
    StartRead(&event_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is over; OnDone follows
    on_event_(std::move(event_));
    event_.Clear();
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& s) override {
    {
      std::lock_guard lock(control_->mu);
      control_->ctx = nullptr;
    }
    on_done_(s);
    delete this;
  }

 private:
  grpc::ClientContext ctx_;
  v1::Batch batch_;
  v1::TokenEvent event_;
  std::function<void(v1::TokenEvent)> on_event_;
  std::function<void(grpc::Status)> on_done_;
  std::shared_ptr<Control> control_;
};

class GrpcWorkerClient final : public WorkerClient {
 public:
  GrpcWorkerClient(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
    grpc::ChannelArguments args;
    // Notice a dead peer on an idle connection within seconds, and retry the connect quickly.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    channel_ = grpc::CreateCustomChannel(address, credentials ? credentials : grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Worker::NewStub(channel_);
  }

  std::shared_ptr<ExecuteCall> Execute(v1::Batch batch, std::function<void(v1::TokenEvent)> on_event,
                                       std::function<void(grpc::Status)> on_done) override {
    auto control = std::make_shared<ExecuteReactor::Control>();
    new ExecuteReactor(stub_.get(), std::move(batch), std::move(on_event), std::move(on_done), control);
    return control;
  }

  void Cancel(std::vector<uint64_t> ids) override {
    struct Call {
      grpc::ClientContext ctx;
      v1::CancelRequest req;
      v1::CancelResponse resp;
    };
    auto* call = new Call;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    for (uint64_t id : ids) call->req.add_sequence_ids(id);
    // Best effort: if the worker is gone, its sequences are gone with it.
    stub_->async()->Cancel(&call->ctx, &call->req, &call->resp, [call](grpc::Status) { delete call; });
  }

  void Status(std::chrono::milliseconds timeout, const v1::StatusRequest& request,
              std::function<void(absl::StatusOr<v1::WorkerStatus>)> done) override {
    struct Call {
      grpc::ClientContext ctx;
      v1::StatusRequest req;
      v1::WorkerStatus resp;
    };
    auto* call = new Call;
    call->req = request;
    call->ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    stub_->async()->Status(&call->ctx, &call->req, &call->resp, [call, done = std::move(done)](grpc::Status s) {
      if (s.ok()) {
        done(std::move(call->resp));
      } else {
        done(FromGrpcStatus(s));
      }
      delete call;
    });
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

}  // namespace

std::unique_ptr<WorkerClient> MakeGrpcWorkerClient(const std::string& address,
                                                   std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return std::make_unique<GrpcWorkerClient>(address, std::move(credentials));
}

}  // namespace tailserve
