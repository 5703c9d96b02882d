#include "tools/load/stream_call.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

namespace tailserve {
namespace {

class Call final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Call(v1::Generation::Stub* stub, v1::GenerateRequest req, double timeout_s, int32_t stop_after, RequestResult* out,
       std::vector<int32_t>* tokens_out, std::function<void()> done)
      : req_(std::move(req)), out_(out), tokens_out_(tokens_out), done_(std::move(done)), stop_after_(stop_after) {
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
    start_ = std::chrono::steady_clock::now();
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (resp_.token_ids_size() > 0 && out_->tokens == 0) out_->ttft_s = Since();
    if (tokens_out_ && !stopped_) tokens_out_->insert(tokens_out_->end(), resp_.token_ids().begin(), resp_.token_ids().end());
    out_->tokens += resp_.token_ids_size();
    if (resp_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out_->finish_reason = resp_.finish_reason();
      out_->prompt_tokens = resp_.usage().prompt_tokens();
      out_->cached_prompt_tokens = resp_.usage().cached_prompt_tokens();
      out_->queue_s = resp_.timings().queue_seconds();
      out_->dispatches = resp_.timings().dispatches();
    }
    if (stop_after_ > 0 && out_->tokens >= stop_after_ && !stopped_) {
      // The request ends here for the client; what the server still streams is not counted.
      stopped_ = true;
      out_->tokens = stop_after_;
      if (tokens_out_) tokens_out_->resize(std::min(tokens_out_->size(), static_cast<size_t>(stop_after_)));
      out_->e2e_s = Since();
      ctx_.TryCancel();
    }
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    out_->code = stopped_ ? grpc::StatusCode::OK : s.error_code();
    if (!stopped_) out_->e2e_s = Since();
    // Delete before signalling: once the caller hears the last call is done it tears down the
    // channel, and no ClientContext may outlive that.
    auto done = std::move(done_);
    delete this;
    done();
  }

 private:
  double Since() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
  RequestResult* out_;
  std::vector<int32_t>* tokens_out_;
  std::function<void()> done_;
  const int32_t stop_after_;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

std::unique_ptr<v1::Generation::Stub> LoadStub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return v1::Generation::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

void SetPlannedLength(const LoadOptions& o, int32_t length, std::mt19937_64& rng, v1::GenerateRequest* req) {
  if (o.sim_eos) {
    const auto [seed, eos] = SimEosSeed(rng(), length, o.vocab);
    req->mutable_sampling()->set_seed(seed);
    req->add_stop_token_ids(eos);
    req->set_max_tokens(std::max(o.max_tokens_cap, length));
  } else {
    req->set_max_tokens(o.client_stop ? std::max(o.max_tokens_cap, length) : length);
    req->mutable_sampling()->set_seed(rng());
  }
}

void StartStreamingCall(v1::Generation::Stub* stub, v1::GenerateRequest req, double timeout_s, int32_t stop_after,
                        RequestResult* out, std::vector<int32_t>* tokens_out, std::function<void()> done) {
  new Call(stub, std::move(req), timeout_s, stop_after, out, tokens_out, std::move(done));  // deletes itself
}

}  // namespace tailserve
