#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <regex>

#include "absl/strings/str_cat.h"

namespace tailserve {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// {a="x",b="y"} plus optional extra label (le or quantile); empty when there are no labels.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     const std::string& extra_name = "", const std::string& extra_value = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", EscapeLabel(values[i]), "\"");
  }
  if (!extra_name.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", extra_name, "=\"", extra_value, "\"");
  return out.empty() ? "" : "{" + out + "}";
}

void CheckName(const std::string& name, const std::string& type) {
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  bool ok = std::regex_match(name, kName);
  const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
  if (ok && (type == "counter") != total) ok = false;
  if (!ok) {
    std::fprintf(stderr, "invalid metric name '%s' for a %s\n", name.c_str(), type.c_str());
    std::abort();
  }
}

const std::vector<double> kQuantiles = {0.5, 0.95, 0.99};

}  // namespace

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Prefer the shortest form that round-trips.
  for (int prec = 1; prec <= 17; ++prec) {
    char shorter[64];
    std::snprintf(shorter, sizeof shorter, "%.*g", prec, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

void Counter::Inc(double v) {
  if (v > 0) AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  std::lock_guard lock(mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) s.cumulative.push_back(acc += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

WindowQuantiles::WindowQuantiles(const Clock& clock, double window_seconds, size_t max_samples)
    : clock_(clock),
      window_(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(window_seconds))),
      max_samples_(max_samples) {}

void WindowQuantiles::Expire(SteadyTime now) const {
  while (!samples_.empty() && (samples_.front().first + window_ < now || samples_.size() > max_samples_)) {
    samples_.pop_front();
  }
}

void WindowQuantiles::Observe(double v) {
  const SteadyTime now = clock_.Now();
  std::lock_guard lock(mu_);
  samples_.emplace_back(now, v);
  Expire(now);
}

WindowQuantiles::Snapshot WindowQuantiles::Read(const std::vector<double>& qs) const {
  Snapshot s;
  std::vector<double> values;
  {
    std::lock_guard lock(mu_);
    Expire(clock_.Now());
    values.reserve(samples_.size());
    for (const auto& [t, v] : samples_) values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  for (double v : values) s.sum += v;
  s.count = values.size();
  for (double q : qs) s.quantiles.push_back(QuantileOfSorted(values, q));
  return s;
}

double QuantileOfSorted(const std::vector<double>& v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4,
          0.5,   0.6,    0.75,  1.0,  1.5,   2.0,  3.0,   5.0, 7.5,  10,  15,   20,  30,   60, 120};
}

std::vector<double> StepTimeBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006,
          0.008,   0.01,   0.015,   0.02,   0.03,  0.05,  0.1,   0.25,  0.5,   1.0, 2.0};
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start + width * i);
  return b;
}

template <class T>
T& Registry::Family<T>::Labels(const std::vector<std::string>& values) {
  if (values.size() != label_names.size()) {
    std::fprintf(stderr, "metric %s: %zu label values for %zu labels\n", name.c_str(), values.size(),
                 label_names.size());
    std::abort();
  }
  std::lock_guard lock(mu_);
  auto& child = children_[values];
  if (!child) {
    if constexpr (std::is_same_v<T, Histogram>) child = std::make_unique<Histogram>(buckets);
    else if constexpr (std::is_same_v<T, WindowQuantiles>) child = std::make_unique<WindowQuantiles>(*clock, window_seconds);
    else child = std::make_unique<T>();
  }
  return *child;
}

template <class T>
void Registry::Family<T>::Serialize(std::string* out) const {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type, "\n");
  std::lock_guard lock(mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = child->Read();
      for (size_t i = 0; i < s.cumulative.size(); ++i) {
        const std::string le = i < s.upper_bounds.size() ? FormatMetricValue(s.upper_bounds[i]) : "+Inf";
        absl::StrAppend(out, name, "_bucket", LabelSet(label_names, values, "le", le), " ", s.cumulative[i], "\n");
      }
      absl::StrAppend(out, name, "_sum", LabelSet(label_names, values), " ", FormatMetricValue(s.sum), "\n");
      absl::StrAppend(out, name, "_count", LabelSet(label_names, values), " ", s.count, "\n");
    } else if constexpr (std::is_same_v<T, WindowQuantiles>) {
      const WindowQuantiles::Snapshot s = child->Read(kQuantiles);
      for (size_t i = 0; i < kQuantiles.size(); ++i) {
        absl::StrAppend(out, name, LabelSet(label_names, values, "quantile", FormatMetricValue(kQuantiles[i])),
                        " ", FormatMetricValue(s.quantiles[i]), "\n");
      }
      absl::StrAppend(out, name, "_sum", LabelSet(label_names, values), " ", FormatMetricValue(s.sum), "\n");
      absl::StrAppend(out, name, "_count", LabelSet(label_names, values), " ", s.count, "\n");
    } else {
      absl::StrAppend(out, name, LabelSet(label_names, values), " ", FormatMetricValue(child->Value()), "\n");
    }
  }
}

template <class T>
Registry::Family<T>& Registry::Add(const std::string& name, const std::string& help, const std::string& type,
                                   std::vector<std::string> label_names) {
  CheckName(name, type);
  auto family = std::make_unique<Family<T>>();
  family->name = name;
  family->help = help;
  family->type = type;
  family->label_names = std::move(label_names);
  family->clock = &clock_;
  Family<T>& ref = *family;
  std::lock_guard lock(mu_);
  families_.push_back(std::move(family));
  return ref;
}

Registry::Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names) {
  return Add<Counter>(name, help, "counter", std::move(label_names));
}

Registry::Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, "gauge", std::move(label_names));
}

Registry::Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                                    std::vector<double> buckets,
                                                    std::vector<std::string> label_names) {
  auto& f = Add<Histogram>(name, help, "histogram", std::move(label_names));
  f.buckets = std::move(buckets);
  return f;
}

Registry::Family<WindowQuantiles>& Registry::AddWindowQuantiles(const std::string& name, const std::string& help,
                                                                double window_seconds,
                                                                std::vector<std::string> label_names) {
  auto& f = Add<WindowQuantiles>(name, help, "summary", std::move(label_names));
  f.window_seconds = window_seconds;
  return f;
}

std::string Registry::Serialize() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& f : families_) f->Serialize(&out);
  return out;
}

template class Registry::Family<Counter>;
template class Registry::Family<Gauge>;
template class Registry::Family<Histogram>;
template class Registry::Family<WindowQuantiles>;

}  // namespace tailserve
