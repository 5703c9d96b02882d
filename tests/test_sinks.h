#pragma once
// A MessageSink that records what a stream received, for scheduler and router-core tests.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "common/server_stream.h"

namespace tailserve {

template <class Msg>
class RecordingSink final : public MessageSink<Msg> {
 public:
  void Write(Msg m) override {
    std::lock_guard lock(mu_);
    messages_.push_back(std::move(m));
    cv_.notify_all();
  }
  void Finish(grpc::Status s) override {
    std::lock_guard lock(mu_);
    ++finishes_;
    if (!status_) status_ = std::move(s);
    cv_.notify_all();
  }
  // Waits (up to 10 s) for Finish; returns its status, or DEADLINE_EXCEEDED if it never came.
  grpc::Status WaitFinish() {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return status_.has_value(); })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: sink never finished");
    }
    return *status_;
  }
  // Waits until `pred(messages)` holds (up to 10 s).
  template <class Pred>
  bool WaitFor(Pred pred) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return pred(messages_); });
  }
  std::vector<Msg> messages() {
    std::lock_guard lock(mu_);
    return messages_;
  }
  bool finished() {
    std::lock_guard lock(mu_);
    return status_.has_value();
  }
  // How many times Finish was called (a stream ends once).
  int finishes() {
    std::lock_guard lock(mu_);
    return finishes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Msg> messages_;
  std::optional<grpc::Status> status_;
  int finishes_ = 0;
};

}  // namespace tailserve
