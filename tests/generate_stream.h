#pragma once
// A streamed Generate call for the integration tests: records token ids, text deltas, the final
// response and the status.
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "tailserve/v1/generation.grpc.pb.h"

namespace tailserve {

// One streamed Generate call, recorded.
class Stream final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Stream(v1::Generation::Stub* stub, v1::GenerateRequest req, double timeout_s = 120) : req_(std::move(req)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      std::lock_guard lock(mu_);
      tokens_.insert(tokens_.end(), resp_.token_ids().begin(), resp_.token_ids().end());
      text_ += resp_.text();
      deltas_.push_back(resp_.text());
      if (resp_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last_ = resp_;
    }
    cv_.notify_all();
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    std::lock_guard lock(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_all();
  }
  grpc::Status Wait(int seconds = 60) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return done_; })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: stream did not end");
    }
    return status_;
  }
  bool WaitTokens(size_t n, int seconds = 30) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return tokens_.size() >= n || done_; }) &&
           tokens_.size() >= n;
  }
  void Cancel() { ctx_.TryCancel(); }
  std::vector<int32_t> tokens() {
    std::lock_guard lock(mu_);
    return tokens_;
  }
  std::string text() {
    std::lock_guard lock(mu_);
    return text_;
  }
  std::vector<std::string> deltas() {
    std::lock_guard lock(mu_);
    return deltas_;
  }
  v1::GenerateResponse last() {
    std::lock_guard lock(mu_);
    return last_;
  }
  const v1::GenerateRequest& request() const { return req_; }

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_, last_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::string text_;
  std::vector<std::string> deltas_;
  grpc::Status status_;
  bool done_ = false;
};

}  // namespace tailserve
