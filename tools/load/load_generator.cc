#include "tools/load/load_generator.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/sim_token.h"
#include "common/splitmix.h"
#include "tailserve/v1/generation.grpc.pb.h"
#include "tools/load/stream_call.h"

namespace tailserve {
namespace {

// "2023-11-16 18:17:03.9799600" -> seconds since the epoch (UTC assumed; only differences matter).
std::optional<double> ParseTimestamp(const std::string& s) {
  const size_t dot = s.find('.');
  absl::Time t;
  std::string err;
  if (!absl::ParseTime("%Y-%m-%d %H:%M:%S", s.substr(0, dot), absl::UTCTimeZone(), &t, &err)) return std::nullopt;
  double frac = 0;
  if (dot != std::string::npos) {
    const std::string f = "0" + s.substr(dot);
    if (!absl::SimpleAtod(f, &frac)) return std::nullopt;
  }
  return absl::ToDoubleSeconds(t - absl::UnixEpoch()) + frac;
}

std::string CodeName(int code) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                 "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : absl::StrCat(code);
}

}  // namespace

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return QuantileOfSorted(v, q);
}

absl::StatusOr<std::vector<PlannedRequest>> LoadTrace(const std::string& path, double speed, const TraceWindow& window,
                                                      int32_t max_prompt_tokens) {
  const size_t limit = window.limit;
  if (!(speed > 0)) return absl::InvalidArgumentError("speed must be > 0");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<PlannedRequest> plan;
  std::optional<double> first;
  std::string line;
  const bool jsonl = path.size() > 6 && path.substr(path.size() - 6) == ".jsonl";
  size_t line_no = 0;
  while (std::getline(in, line) && (limit == 0 || plan.size() < limit)) {
    ++line_no;
    if (line.empty() || (!jsonl && line_no == 1)) continue;  // CSV header
    double t;
    int64_t prompt, output;
    std::vector<int64_t> hash_ids;
    if (jsonl) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("timestamp")) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": bad JSON row"));
      t = j["timestamp"].get<double>() / 1000.0;
      prompt = j["input_length"].get<int64_t>();
      output = j["output_length"].get<int64_t>();
      if (j.contains("hash_ids")) {
        if (!j["hash_ids"].is_array()) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": hash_ids: expected an array"));
        for (const auto& h : j["hash_ids"]) {
          if (!h.is_number_integer()) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": hash_ids: expected integers"));
          hash_ids.push_back(h.get<int64_t>());
        }
      }
    } else {
      std::vector<std::string> f = absl::StrSplit(line, ',');
      std::optional<double> ts = f.size() == 3 ? ParseTimestamp(f[0]) : std::nullopt;
      if (!ts || !absl::SimpleAtoi(f[1], &prompt) || !absl::SimpleAtoi(f[2], &output)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": expected TIMESTAMP,ContextTokens,GeneratedTokens"));
      }
      t = *ts;
    }
    if (!first) first = t;
    const double at = t - *first;
    if (at < window.from_s) continue;
    if (window.duration_s > 0 && at >= window.from_s + window.duration_s) break;
    PlannedRequest r;
    r.arrival_s = (at - window.from_s) / speed;
    r.prompt_tokens = static_cast<int32_t>(std::clamp<int64_t>(prompt, 1, max_prompt_tokens));
    r.max_tokens = static_cast<int32_t>(std::max<int64_t>(output, 1));
    r.hash_ids = std::move(hash_ids);
    plan.push_back(std::move(r));
  }
  return plan;
}

absl::StatusOr<std::vector<PlannedRequest>> LoadPromptSet(const std::string& path, double rate,
                                                          int32_t default_max_tokens, size_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<PlannedRequest> plan;
  std::string line;
  for (size_t line_no = 1; std::getline(in, line) && (limit == 0 || plan.size() < limit); ++line_no) {
    if (line.empty()) continue;
    const std::string at = absl::StrCat(path, ":", line_no, ": ");
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(at + "not a JSON object");
    if (!j.contains("prompt") || !j["prompt"].is_string() || j["prompt"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(at + "prompt: expected a non-empty string");
    }
    PlannedRequest r;
    r.arrival_s = rate > 0 ? static_cast<double>(plan.size()) / rate : 0.0;
    r.prompt_text = j["prompt"].get<std::string>();
    r.max_tokens = default_max_tokens;
    if (j.contains("max_tokens")) {
      if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1 ||
          j["max_tokens"].get<int64_t>() > (int64_t{1} << 30)) {
        return absl::InvalidArgumentError(at + "max_tokens: expected a positive integer");
      }
      r.max_tokens = j["max_tokens"].get<int32_t>();
    }
    for (auto [key, field] : {std::pair{"temperature", &r.temperature}, std::pair{"top_p", &r.top_p}}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_number() || j[key].get<double>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(at, key, ": expected a number >= 0"));
      }
      *field = j[key].get<float>();
    }
    plan.push_back(std::move(r));
  }
  return plan;
}

std::vector<PlannedRequest> FixedRatePlan(size_t n, double rate, int32_t prompt_tokens, int32_t max_tokens) {
  std::vector<PlannedRequest> plan;
  for (size_t i = 0; i < n; ++i) {
    PlannedRequest r;
    r.arrival_s = rate > 0 ? i / rate : 0.0;
    r.prompt_tokens = prompt_tokens;
    r.max_tokens = max_tokens;
    plan.push_back(std::move(r));
  }
  return plan;
}

std::vector<int32_t> HashIdPromptTokens(const PlannedRequest& r, int32_t vocab, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(r.prompt_tokens));
  if (r.hash_ids.empty()) return tokens;
  for (int32_t k = 0; k < r.prompt_tokens; ++k) {
    const size_t block = std::min<size_t>(static_cast<size_t>(k / kTraceHashBlockTokens), r.hash_ids.size() - 1);
    const uint64_t key = static_cast<uint64_t>(r.hash_ids[block]) * kTraceHashBlockTokens +
                         static_cast<uint64_t>(k % kTraceHashBlockTokens);
    tokens[static_cast<size_t>(k)] =
        static_cast<int32_t>(SplitMixFinalize(key ^ (seed * kSplitMixGamma)) % static_cast<uint64_t>(vocab));
  }
  return tokens;
}

std::pair<uint64_t, int32_t> SimEosSeed(uint64_t seed, int32_t length, int32_t vocab) {
  std::vector<bool> seen(static_cast<size_t>(vocab));
  for (;; ++seed) {
    const int32_t eos = SimToken(seed, length - 1, vocab);
    bool unique = true;
    for (int32_t i = 0; i + 1 < length && unique; ++i) unique = SimToken(seed, i, vocab) != eos;
    if (unique) return {seed, eos};
  }
}

LoadReport RunLoad(const LoadOptions& o, const std::vector<PlannedRequest>& plan) {
  auto stub = LoadStub(o.target);
  LoadReport report;
  report.ttft_slo_s = o.ttft_slo_s, report.tpot_slo_s = o.tpot_slo_s;
  report.results.resize(plan.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = plan.size();
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<int32_t>> tokens(o.tokens_out.empty() ? 0 : plan.size());
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < plan.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<int64_t>(plan[i].arrival_s * 1e6)));
    v1::GenerateRequest req;
    req.set_request_id(absl::StrCat("load-", i));
    if (!plan[i].prompt_text.empty()) {
      req.set_prompt(plan[i].prompt_text);
      req.mutable_sampling()->set_temperature(plan[i].temperature);
      req.mutable_sampling()->set_top_p(plan[i].top_p);
    } else if (plan[i].hash_ids.empty()) {
      for (int32_t k = 0; k < plan[i].prompt_tokens; ++k) req.add_prompt_token_ids(static_cast<int32_t>(rng() % o.vocab));
    } else {
      for (int32_t t : HashIdPromptTokens(plan[i], o.vocab, o.seed)) req.add_prompt_token_ids(t);
    }
    SetPlannedLength(o, plan[i].max_tokens, rng, &req);
    req.set_priority(static_cast<v1::Priority>(o.priority));
    report.results[i].expected_tokens = plan[i].max_tokens;
    StartStreamingCall(stub.get(), std::move(req), o.timeout_s, o.client_stop ? plan[i].max_tokens : 0,
                       &report.results[i], tokens.empty() ? nullptr : &tokens[i], [&] {
      std::lock_guard lock(mu);
      if (--remaining == 0) cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return remaining == 0; });
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.tokens_out.empty()) {
    std::ofstream out(o.tokens_out);
    for (size_t i = 0; i < plan.size(); ++i) {
      const RequestResult& r = report.results[i];
      nlohmann::json line = {{"i", i},          {"code", r.code},         {"arrival_s", plan[i].arrival_s},
                             {"e2e_s", r.e2e_s}, {"ttft_s", r.ttft_s},     {"dispatches", r.dispatches},
                             {"tokens", tokens[i]}};
      out << line.dump() << "\n";
    }
  }
  return report;
}

namespace {
struct Summary {
  std::map<std::string, int> codes;
  size_t ok = 0;
  size_t attained = 0;  // ok and within both SLOs
  int64_t tokens = 0;
  double e2e_sum = 0;
  std::vector<double> queue, ttft, e2e, per_token, tpot;
  std::vector<double> output_tokens;  // per successful request
  size_t ended_by_stop = 0;           // of them, ended by EOS or a stop string
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0;  // all results' usage
};
Summary Summarise(const LoadReport& r) {
  Summary s;
  for (const auto& x : r.results) {
    ++s.codes[CodeName(x.code)];
    s.prompt_tokens += x.prompt_tokens;
    s.cached_prompt_tokens += x.cached_prompt_tokens;
    if (x.code != 0) continue;
    ++s.ok;
    s.tokens += x.tokens;
    s.e2e_sum += x.e2e_s;
    s.output_tokens.push_back(x.tokens);
    s.ended_by_stop += x.finish_reason == v1::FINISH_REASON_STOP;
    s.queue.push_back(x.queue_s);
    s.ttft.push_back(x.ttft_s);
    s.e2e.push_back(x.e2e_s);
    if (x.tokens > 0) s.per_token.push_back(x.e2e_s / x.tokens);
    if (x.tokens > 1) s.tpot.push_back(x.tpot_s());
    if (x.ttft_s <= r.ttft_slo_s && x.tpot_s() <= r.tpot_slo_s) ++s.attained;
  }
  return s;
}
}  // namespace

std::string LoadReport::Table() const {
  const Summary s = Summarise(*this);
  std::string out = absl::StrFormat("requests %zu  ok %zu  wall %.2f s  throughput %.2f req/s  %.1f output tok/s\n",
                                    results.size(), s.ok, wall_s, s.ok / wall_s, s.tokens / wall_s);
  out += "status:";
  for (const auto& [c, n] : s.codes) absl::StrAppend(&out, " ", c, "=", n);
  out += "\n";
  out += absl::StrFormat("%-22s %10s %10s %10s\n", "metric (ms)", "P50", "P95", "P99");
  auto row = [&](const char* name, const std::vector<double>& v) {
    out += absl::StrFormat("%-22s %10.2f %10.2f %10.2f\n", name, 1e3 * Percentile(v, 0.5), 1e3 * Percentile(v, 0.95),
                           1e3 * Percentile(v, 0.99));
  };
  row("queue", s.queue);
  row("ttft", s.ttft);
  row("e2e", s.e2e);
  row("e2e / output token", s.per_token);
  row("tpot", s.tpot);
  if (!s.output_tokens.empty()) {
    out += absl::StrFormat("output tokens: P10 %.0f  P50 %.0f  P90 %.0f  max %.0f; ended by EOS or a stop %.1f%%\n",
                           Percentile(s.output_tokens, 0.1), Percentile(s.output_tokens, 0.5),
                           Percentile(s.output_tokens, 0.9), Percentile(s.output_tokens, 1.0),
                           100.0 * s.ended_by_stop / s.ok);
  }
  if (s.cached_prompt_tokens > 0 || oracle_cached_tokens >= 0) {
    out += absl::StrFormat("prefix cache: %.1f%% of %d prompt tokens cached", 100.0 * s.cached_prompt_tokens /
                           std::max<int64_t>(1, s.prompt_tokens), s.prompt_tokens);
    if (oracle_cached_tokens >= 0) {
      out += absl::StrFormat(" (an unbounded cache: %.1f%%)",
                             100.0 * oracle_cached_tokens / std::max<int64_t>(1, oracle_prompt_tokens));
    }
    out += "\n";
  }
  out += absl::StrFormat("mean e2e %.2f ms; SLO (TTFT <= %.0f ms, TPOT <= %.0f ms) met by %.1f%%, goodput %.2f req/s\n",
                         s.ok ? 1e3 * s.e2e_sum / s.ok : 0.0, 1e3 * ttft_slo_s, 1e3 * tpot_slo_s,
                         results.empty() ? 0.0 : 100.0 * s.attained / results.size(), s.attained / wall_s);
  return out;
}

std::string LoadReport::Json() const {
  const Summary s = Summarise(*this);
  nlohmann::json j;
  j["requests"] = results.size();
  j["ok"] = s.ok;
  j["wall_s"] = wall_s;
  j["throughput_rps"] = s.ok / wall_s;
  j["output_tokens_per_s"] = s.tokens / wall_s;
  j["status"] = s.codes;
  auto q = [&](const std::vector<double>& v) {
    return nlohmann::json{{"p50", Percentile(v, 0.5)}, {"p95", Percentile(v, 0.95)}, {"p99", Percentile(v, 0.99)}};
  };
  j["queue_s"] = q(s.queue);
  j["ttft_s"] = q(s.ttft);
  j["e2e_s"] = q(s.e2e);
  j["e2e_per_token_s"] = q(s.per_token);
  j["tpot_s"] = q(s.tpot);
  j["e2e_mean_s"] = s.ok ? s.e2e_sum / s.ok : 0.0;
  j["output_tokens"] = {{"p10", Percentile(s.output_tokens, 0.1)},
                        {"p50", Percentile(s.output_tokens, 0.5)},
                        {"p90", Percentile(s.output_tokens, 0.9)},
                        {"max", Percentile(s.output_tokens, 1.0)}};
  j["ended_by_stop"] = s.ok ? static_cast<double>(s.ended_by_stop) / s.ok : 0.0;
  j["prompt_tokens"] = s.prompt_tokens;
  j["cached_prompt_tokens"] = s.cached_prompt_tokens;
  if (oracle_cached_tokens >= 0) {
    j["oracle_cached_tokens"] = oracle_cached_tokens;
    j["oracle_prompt_tokens"] = oracle_prompt_tokens;
  }
  j["slo"] = {{"ttft_s", ttft_slo_s}, {"tpot_s", tpot_slo_s}};
  j["slo_attainment"] = results.empty() ? 0.0 : static_cast<double>(s.attained) / results.size();
  j["goodput_rps"] = s.attained / wall_s;
  return j.dump(2);
}

}  // namespace tailserve
