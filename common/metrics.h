#pragma once
// A small, strict Prometheus metrics registry: counters, gauges, histograms, and sliding-window
// quantile summaries, exposed in the Prometheus text format (0.0.4). Families are registered once
// at start; children (one per label-value tuple) are created on first use and never removed.
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"

namespace tailserve {

class Counter {
 public:
  void Inc(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  // Cumulative counts per bucket (the last is +Inf), the sum and the count, read consistently.
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, +Inf last
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Quantiles over the observations of the last `window` (at most `max_samples` kept, oldest dropped
// first), for dashboards that want P50/P95/P99 without PromQL. Exposed as a Prometheus summary.
class WindowQuantiles {
 public:
  WindowQuantiles(const Clock& clock, double window_seconds, size_t max_samples = 20000);
  void Observe(double v);
  struct Snapshot {
    std::vector<double> quantiles;  // same order as the asked quantiles; NaN when empty
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read(const std::vector<double>& qs) const;

 private:
  void Expire(SteadyTime now) const;
  const Clock& clock_;
  const Duration window_;
  const size_t max_samples_;
  mutable std::mutex mu_;
  mutable std::deque<std::pair<SteadyTime, double>> samples_;
};

// The q-quantile of ascending `sorted` values by linear interpolation between closest ranks
// (numpy's default); NaN when empty.
double QuantileOfSorted(const std::vector<double>& sorted, double q);

// Bucket layouts shared by both processes.
std::vector<double> LatencyBuckets();   // seconds, 1 ms .. 120 s
std::vector<double> StepTimeBuckets();  // seconds, 50 us .. 2 s
std::vector<double> LinearBuckets(double start, double width, int count);

class Registry {
 public:
  explicit Registry(const Clock& clock = SystemClock::Get()) : clock_(clock) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  template <class T>
  class Family;

  // Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; counters must end in _total. Violations abort at
  // registration, which only happens at start with literal names.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> buckets, std::vector<std::string> label_names = {});
  Family<WindowQuantiles>& AddWindowQuantiles(const std::string& name, const std::string& help,
                                              double window_seconds,
                                              std::vector<std::string> label_names = {});

  // The Prometheus text exposition of every family, in registration order.
  std::string Serialize() const;

  class FamilyBase {
   public:
    virtual ~FamilyBase() = default;
    virtual void Serialize(std::string* out) const = 0;
  };

  template <class T>
  class Family final : public FamilyBase {
   public:
    using Factory = std::unique_ptr<T> (*)(const Family&);
    // The child for these label values (in label_names order); created on first use.
    T& Labels(const std::vector<std::string>& values);
    T& Get() { return Labels({}); }
    void Serialize(std::string* out) const override;

    std::string name, help, type;
    std::vector<std::string> label_names;
    std::vector<double> buckets;
    double window_seconds = 0;
    const Clock* clock = nullptr;

   private:
    mutable std::mutex mu_;
    std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
  };

 private:
  template <class T>
  Family<T>& Add(const std::string& name, const std::string& help, const std::string& type,
                 std::vector<std::string> label_names);
  const Clock& clock_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_;
};

// Formats a double as Prometheus expects (+Inf, -Inf, NaN, shortest round-trip otherwise).
std::string FormatMetricValue(double v);

}  // namespace tailserve
