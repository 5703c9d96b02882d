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
      std::lock_guard lock(mu_);
      q_.push_back(std::move(c));
    }
    cv_.notify_one();
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
};

}  // namespace tailserve
