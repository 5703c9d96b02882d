#pragma once
// Multi-producer, single-consumer command queue: how other threads hand work to the one thread
// that owns a piece of state (the router core, the worker scheduler).
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include "common/clock.h"

namespace tailserve {

class CommandQueue {
 public:
  using Command = std::function<void()>;

  void Post(Command c) {
    {
      std::unique_lock lock(mu_);
      if (!closed_) {
        q_.push_back(std::move(c));
        lock.unlock();
        cv_.notify_one();
        return;
      }
    }
    std::lock_guard run(run_mu_);  // closed: the owner thread is gone, run it here, one at a time
    c();
  }

  // The owner thread has stopped: runs what is queued, and from then on Post runs each command at
  // once on the posting thread (serialised), so a command that answers a caller (a refusal after
  // shutdown) is never left in a queue nobody reads.
  void Close() {
    std::lock_guard run(run_mu_);
    std::deque<Command> rest;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      rest.swap(q_);
    }
    for (auto& c : rest) c();
  }

  // Waits until a command is there or `deadline` (steady clock) passes, then takes everything.
  std::deque<Command> TakeAll(std::optional<SteadyTime> deadline) {
    std::unique_lock lock(mu_);
    if (deadline) {
      cv_.wait_until(lock, *deadline, [&] { return !q_.empty(); });
    } else {
      cv_.wait(lock, [&] { return !q_.empty(); });
    }
    std::deque<Command> out;
    out.swap(q_);
    return out;
  }

  std::deque<Command> TryTakeAll() {
    std::lock_guard lock(mu_);
    std::deque<Command> out;
    out.swap(q_);
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> q_;
  bool closed_ = false;  // guarded by mu_
  // Commands run after Close one at a time; recursive, so one that posts runs the new one nested.
  std::recursive_mutex run_mu_;
};

}  // namespace tailserve
