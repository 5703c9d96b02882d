#pragma once
// Injectable time source: production code reads time through Clock so tests can drive it.
#include <chrono>
#include <mutex>

namespace tailserve {

using SteadyTime = std::chrono::steady_clock::time_point;
using Duration = std::chrono::steady_clock::duration;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyTime Now() const = 0;
};

class SystemClock final : public Clock {
 public:
  SteadyTime Now() const override { return std::chrono::steady_clock::now(); }
  static const Clock& Get() {
    static const SystemClock clock;
    return clock;
  }
};

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override {
    std::lock_guard lock(mu_);
    return now_;
  }
  void Advance(Duration d) {
    std::lock_guard lock(mu_);
    now_ += d;
  }

 private:
  mutable std::mutex mu_;
  SteadyTime now_{std::chrono::hours(1)};
};

inline double Seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace tailserve
