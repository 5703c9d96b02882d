#pragma once
// A server-streaming gRPC reactor whose writes and finish may come from any thread, in any order,
// without blocking: messages are queued and written one at a time; Finish waits for the queue.
// Owners hold a shared_ptr<MessageSink<Msg>> that stays valid after gRPC has deleted the reactor
// (calls then do nothing), so a late token can never touch a freed stream. A client that stops
// reading cannot make the queue grow without bound: past `max_queued` messages waiting behind the
// transport's flow-control window, the call is cancelled (on_cancel runs, the client sees CANCELLED).
#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

namespace tailserve {

template <class Msg>
class MessageSink {
 public:
  virtual ~MessageSink() = default;
  virtual void Write(Msg msg) = 0;
  virtual void Finish(grpc::Status status) = 0;
};

template <class Msg>
class ServerStream final : public grpc::ServerWriteReactor<Msg> {
 public:
  class Handle final : public MessageSink<Msg> {
   public:
    void Write(Msg msg) override {
      std::unique_lock lock(mu_);
      if (reactor_ == nullptr || finish_ || broken_) return;
      if (max_queued_ > 0 && queue_.size() >= max_queued_ && ctx_ != nullptr) {
        broken_ = true;
        if (writing_) queue_.erase(queue_.begin() + 1, queue_.end());  // the front is being written
        grpc::CallbackServerContext* ctx = ctx_;
        lock.unlock();
        ctx->TryCancel();  // OnCancel runs on_cancel; the pending write fails and OnDone follows
        return;
      }
      queue_.push_back(std::move(msg));
      if (writing_) return;
      writing_ = true;
      const Msg* next = &queue_.front();
      ServerStream* r = reactor_;
      lock.unlock();
      r->StartWrite(next);
    }
    void Finish(grpc::Status status) override {
      std::unique_lock lock(mu_);
      if (reactor_ == nullptr || finish_) return;
      finish_ = std::move(status);
      if (writing_) return;  // OnWriteDone finishes once the queue drains
      ServerStream* r = reactor_;
      grpc::Status s = *finish_;
      lock.unlock();
      r->Finish(s);
    }

   private:
    friend class ServerStream;
    std::mutex mu_;
    ServerStream* reactor_ = nullptr;
    std::deque<Msg> queue_;
    bool writing_ = false;
    bool broken_ = false;
    std::optional<grpc::Status> finish_;
    grpc::CallbackServerContext* ctx_ = nullptr;
    size_t max_queued_ = 0;
  };

  // How many messages a stream may queue behind a client that does not read (the transport's
  // flow-control window holds more before them).
  static constexpr size_t kDefaultMaxQueued = 1024;

  // `on_cancel` runs once if the client cancels or its deadline passes, on a gRPC thread; it must
  // not block.
  // `ctx` (null: no bound) is the call's context, cancelled when `max_queued` messages (0: no bound)
  // wait behind a client that does not read.
  explicit ServerStream(std::function<void()> on_cancel, grpc::CallbackServerContext* ctx = nullptr,
                        size_t max_queued = kDefaultMaxQueued)
      : handle_(std::make_shared<Handle>()), on_cancel_(std::move(on_cancel)) {
    handle_->reactor_ = this;
    handle_->ctx_ = ctx;
    handle_->max_queued_ = max_queued;
  }

  std::shared_ptr<Handle> handle() const { return handle_; }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(handle_->mu_);
    handle_->queue_.pop_front();
    if (!ok) {
      handle_->broken_ = true;
      handle_->queue_.clear();
    }
    if (!handle_->queue_.empty()) {
      const Msg* next = &handle_->queue_.front();
      lock.unlock();
      this->StartWrite(next);
      return;
    }
    handle_->writing_ = false;
    if (handle_->finish_) {
      grpc::Status s = *handle_->finish_;
      lock.unlock();
      this->Finish(s);
    }
  }

  void OnCancel() override {
    if (on_cancel_) on_cancel_();
  }

  void OnDone() override {
    {
      std::lock_guard lock(handle_->mu_);
      handle_->reactor_ = nullptr;
      handle_->queue_.clear();
    }
    delete this;
  }

 private:
  std::shared_ptr<Handle> handle_;
  std::function<void()> on_cancel_;
};

}  // namespace tailserve
