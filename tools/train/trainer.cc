#include "tools/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "router/predictor/onnx_writer.h"
#include "tools/load/load_generator.h"

namespace tailserve {
namespace {

struct Standardizer {
  std::array<double, kNumFeatures> mean{}, scale{};  // scale 0: constant feature, ignored
  explicit Standardizer(const std::vector<Sample>& s) {
    for (int j = 0; j < kNumFeatures; ++j) {
      double m = 0, v = 0;
      for (const Sample& x : s) m += x.x[j];
      m /= s.size();
      for (const Sample& x : s) v += (x.x[j] - m) * (x.x[j] - m);
      v /= s.size();
      mean[j] = m;
      scale[j] = v > 1e-12 ? std::sqrt(v) : 0.0;
    }
  }
  double Z(const FeatureVector& x, int j) const { return scale[j] > 0 ? (x[j] - mean[j]) / scale[j] : 0.0; }
};

// Solves A x = b (n x n, row-major) by Gaussian elimination with partial pivoting.
std::vector<double> Solve(std::vector<double> a, std::vector<double> b) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r) if (std::abs(a[r * n + c]) > std::abs(a[p * n + c])) p = r;
    for (size_t k = 0; k < n; ++k) std::swap(a[c * n + k], a[p * n + k]);
    std::swap(b[c], b[p]);
    if (std::abs(a[c * n + c]) < 1e-15) continue;
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r * n + c] / a[c * n + c];
      for (size_t k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n, 0.0);
  for (size_t c = n; c-- > 0;) {
    if (std::abs(a[c * n + c]) < 1e-15) continue;
    double s = b[c];
    for (size_t k = c + 1; k < n; ++k) s -= a[c * n + k] * x[k];
    x[c] = s / a[c * n + c];
  }
  return x;
}

double Target(const Sample& s) { return std::log1p(s.steps); }

}  // namespace

absl::StatusOr<std::vector<Sample>> ReadFeedbackLog(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<Sample> out;
  std::string line;
  for (size_t no = 1; std::getline(in, line); ++no) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("features") || !j.contains("actual_steps")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", no, ": expected {\"features\": {...}, \"actual_steps\": n}"));
    }
    Sample s;
    for (int k = 0; k < kNumFeatures; ++k) {
      const auto& f = j["features"];
      if (!f.contains(kFeatureNames[k]) || !f[kFeatureNames[k]].is_number()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", no, ": feature '", kFeatureNames[k], "' missing"));
      }
      s.x[k] = f[kFeatureNames[k]].get<float>();
    }
    s.steps = j["actual_steps"].get<double>();
    if (s.steps >= 1) out.push_back(s);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no samples"));
  return out;
}

absl::StatusOr<std::vector<Sample>> ReadTrace(const std::string& path, const FeatureInput& defaults, size_t limit) {
  TAILSERVE_ASSIGN_OR_RETURN(const std::vector<PlannedRequest> plan,
                             LoadTrace(path, 1.0, TraceWindow{0, 0, limit}, 1 << 30));
  std::vector<Sample> out;
  for (const PlannedRequest& r : plan) {
    FeatureInput f = defaults;
    f.prompt_tokens = r.prompt_tokens;
    out.push_back({MakeFeatures(f), static_cast<double>(r.max_tokens)});
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no rows"));
  return out;
}

Fit FitLinear(const std::vector<Sample>& samples, double ridge) {
  const Standardizer st(samples);
  constexpr int n = kNumFeatures + 1;  // + intercept (last)
  std::vector<double> ata(n * n, 0.0), aty(n, 0.0);
  for (const Sample& s : samples) {
    std::array<double, n> z{};
    for (int j = 0; j < kNumFeatures; ++j) z[j] = st.Z(s.x, j);
    z[kNumFeatures] = 1.0;
    const double y = Target(s);
    for (int r = 0; r < n; ++r) {
      aty[r] += z[r] * y;
      for (int c = 0; c < n; ++c) ata[r * n + c] += z[r] * z[c];
    }
  }
  for (int j = 0; j < kNumFeatures; ++j) ata[j * n + j] += ridge * samples.size();
  const std::vector<double> beta = Solve(ata, aty);
  // Fold the standardization into raw-feature weights.
  std::vector<float> w(kNumFeatures, 0.0f);
  double b = beta[kNumFeatures];
  for (int j = 0; j < kNumFeatures; ++j) {
    if (st.scale[j] == 0) continue;
    w[j] = static_cast<float>(beta[j] / st.scale[j]);
    b -= beta[j] * st.mean[j] / st.scale[j];
  }
  Fit fit;
  fit.model = LinearLengthModel(w, static_cast<float>(b), "ridge regression of ln(1+steps) on the tailserve features");
  fit.predict = [w, b = static_cast<float>(b)](const FeatureVector& x) {
    float acc = 0;
    for (int j = 0; j < kNumFeatures; ++j) acc += x[j] * w[j];
    return std::exp(static_cast<double>(acc + b)) - 1.0;
  };
  return fit;
}

Fit FitMlp(const std::vector<Sample>& samples, int hidden, int epochs, uint64_t seed) {
  const Standardizer st(samples);
  const int n = kNumFeatures, h = hidden;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> init(0.0, 1.0 / std::sqrt(static_cast<double>(n)));
  std::vector<double> w1(n * h), b1(h, 0.0), w2(h), grad(n * h + h + h + 1), m(grad.size(), 0.0), v(grad.size(), 0.0);
  for (double& x : w1) x = init(rng);
  for (double& x : w2) x = init(rng);
  double mean_y = 0;
  for (const Sample& s : samples) mean_y += Target(s);
  double b2 = mean_y / samples.size();
  std::vector<std::array<double, kNumFeatures>> z(samples.size());
  for (size_t i = 0; i < samples.size(); ++i)
    for (int j = 0; j < n; ++j) z[i][j] = st.Z(samples[i].x, j);
  const double lr = 0.01, beta1 = 0.9, beta2 = 0.999;
  std::vector<double> a(h);
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    std::fill(grad.begin(), grad.end(), 0.0);
    for (size_t i = 0; i < samples.size(); ++i) {
      double out = b2;
      for (int k = 0; k < h; ++k) {
        double s = b1[k];
        for (int j = 0; j < n; ++j) s += z[i][j] * w1[j * h + k];
        a[k] = s > 0 ? s : 0;
        out += a[k] * w2[k];
      }
      const double d = 2.0 * (out - Target(samples[i])) / samples.size();
      for (int k = 0; k < h; ++k) {
        grad[n * h + h + k] += d * a[k];
        if (a[k] <= 0) continue;
        const double dk = d * w2[k];
        grad[n * h + k] += dk;
        for (int j = 0; j < n; ++j) grad[j * h + k] += dk * z[i][j];
      }
      grad.back() += d;
    }
    auto step = [&](size_t idx, double& param) {
      m[idx] = beta1 * m[idx] + (1 - beta1) * grad[idx];
      v[idx] = beta2 * v[idx] + (1 - beta2) * grad[idx] * grad[idx];
      const double mh = m[idx] / (1 - std::pow(beta1, epoch)), vh = v[idx] / (1 - std::pow(beta2, epoch));
      param -= lr * mh / (std::sqrt(vh) + 1e-8);
    };
    for (int k = 0; k < n * h; ++k) step(k, w1[k]);
    for (int k = 0; k < h; ++k) step(n * h + k, b1[k]);
    for (int k = 0; k < h; ++k) step(n * h + h + k, w2[k]);
    step(grad.size() - 1, b2);
  }
  // Fold the standardization into the first layer.
  std::vector<float> fw1(n * h, 0.0f), fb1(h), fw2(w2.begin(), w2.end());
  for (int k = 0; k < h; ++k) {
    double bias = b1[k];
    for (int j = 0; j < n; ++j) {
      if (st.scale[j] == 0) continue;
      fw1[j * h + k] = static_cast<float>(w1[j * h + k] / st.scale[j]);
      bias -= w1[j * h + k] * st.mean[j] / st.scale[j];
    }
    fb1[k] = static_cast<float>(bias);
  }
  Fit fit;
  fit.model = MlpLengthModel(fw1, fb1, fw2, static_cast<float>(b2), n,
                             absl::StrCat("MLP (", h, " ReLU units) of ln(1+steps) on the tailserve features"));
  fit.predict = [fw1, fb1, fw2, b2 = static_cast<float>(b2), n, h](const FeatureVector& x) {
    float out = b2;
    for (int k = 0; k < h; ++k) {
      float s = fb1[k];
      for (int j = 0; j < n; ++j) s += x[j] * fw1[j * h + k];
      out += (s > 0 ? s : 0) * fw2[k];
    }
    return std::exp(static_cast<double>(out)) - 1.0;
  };
  return fit;
}

namespace {
std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> rank(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) rank[order[k]] = 0.5 * static_cast<double>(i + j);
    i = j + 1;
  }
  return rank;
}
}  // namespace

double RankCorrelation(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2) return 0;
  const std::vector<double> ra = Ranks(a), rb = Ranks(b);
  const double n = static_cast<double>(a.size()), mean = 0.5 * (n - 1);
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - mean) * (rb[i] - mean);
    va += (ra[i] - mean) * (ra[i] - mean);
    vb += (rb[i] - mean) * (rb[i] - mean);
  }
  return va > 0 && vb > 0 ? cov / std::sqrt(va * vb) : 0.0;
}

Evaluation Evaluate(const Predictor& p, const std::vector<Sample>& samples) {
  Evaluation e;
  std::vector<double> predicted, actual;
  for (const Sample& s : samples) {
    const double pred = p(s.x), err = std::abs(pred - s.steps);
    predicted.push_back(pred);
    actual.push_back(s.steps);
    e.mae += err;
    e.mape += err / s.steps;
    e.within_20 += err <= 0.2 * s.steps ? 1 : 0;
  }
  const double n = static_cast<double>(samples.size());
  e.mae /= n;
  e.mape /= n;
  e.within_20 /= n;
  e.rank_corr = RankCorrelation(predicted, actual);
  return e;
}

}  // namespace tailserve
