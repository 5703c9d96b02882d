// Router overhead on this machine: what the router adds to a request's latency, and the request
// rate one router sustains, against sim workers whose step time is zero (so everything measured is
// RPC, queueing and relay cost, not simulated model time).
//
//   tailserve-bench-router [--requests 2000] [--seconds 10] [--concurrency 64,256]
//
// Latency: the same 1-token request sent one at a time (a) straight to a worker's Execute and
// (b) through the router's Generate; overhead = (b) - (a) per percentile. Rate: closed loop, C
// requests always in flight, for --seconds each. The client runs on the same 2 cores, so the rate
// is a lower bound on what the router alone could do.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "tailserve/v1/generation.grpc.pb.h"
#include "tailserve/v1/worker.grpc.pb.h"
#include "tools/load/load_generator.h"

namespace tailserve {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

v1::GenerateRequest OneToken(int i, int max_tokens) {
  v1::GenerateRequest r;
  for (int k = 0; k < 16; ++k) r.add_prompt_token_ids((k * 13 + i) % 256);
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_seed(i);
  return r;
}

// Closed loop: keeps `concurrency` Generate calls in flight until `deadline`.
class ClosedLoop {
 public:
  ClosedLoop(v1::Generation::Stub* stub, int max_tokens) : stub_(stub), max_tokens_(max_tokens) {}
  struct Result {
    int64_t ok = 0, failed = 0, tokens = 0;
    double seconds = 0;
    std::vector<double> latency_ms;
  };
  Result Run(int concurrency, double seconds) {
    deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
    const auto start = Clock::now();
    for (int i = 0; i < concurrency; ++i) Launch();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return outstanding_ == 0; });
    result_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return result_;
  }

 private:
  class Call final : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    Call(ClosedLoop* loop, v1::GenerateRequest req) : loop_(loop), req_(std::move(req)), start_(Clock::now()) {
      loop->stub_->async()->Generate(&ctx_, &req_, this);
      StartRead(&resp_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      tokens_ += resp_.token_ids_size();
      StartRead(&resp_);
    }
    void OnDone(const grpc::Status& s) override {
      ClosedLoop* loop = loop_;
      const int tokens = tokens_;
      const double ms = Ms(Clock::now() - start_);
      delete this;  // before Finished: the last Finished lets the caller tear the channel down
      loop->Finished(s, tokens, ms);
    }

   private:
    ClosedLoop* loop_;
    grpc::ClientContext ctx_;
    v1::GenerateRequest req_;
    v1::GenerateResponse resp_;
    int tokens_ = 0;
    Clock::time_point start_;
  };

  void Launch() {
    {
      std::lock_guard lock(mu_);
      ++outstanding_;
    }
    new Call(this, OneToken(static_cast<int>(next_++), max_tokens_));
  }
  void Finished(const grpc::Status& s, int tokens, double ms) {
    const bool ok = s.ok();
    bool again;
    {
      std::lock_guard lock(mu_);
      if (!ok && first_error_.empty()) first_error_ = absl::StrCat(s.error_code(), " ", s.error_message());
      (ok ? result_.ok : result_.failed)++;
      result_.tokens += tokens;
      result_.latency_ms.push_back(ms);
      again = Clock::now() < deadline_;
    }
    if (again) Launch();
    std::lock_guard lock(mu_);
    if (--outstanding_ == 0) cv_.notify_all();
  }

  v1::Generation::Stub* stub_;
  const int max_tokens_;
  Clock::time_point deadline_;
  std::atomic<uint64_t> next_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int outstanding_ = 0;
  Result result_;

 public:
  std::string first_error_;
};

int Main(int argc, char** argv) {
  CLI::App app{"tailserve router overhead benchmark"};
  int requests = 2000;
  double seconds = 10;
  std::string concurrency = "16,64,256";
  std::string bin_dir = TAILSERVE_BIN_DIR;
  app.add_option("--requests", requests, "sequential requests per latency measurement");
  app.add_option("--seconds", seconds, "duration of each closed-loop rate measurement");
  app.add_option("--concurrency", concurrency, "comma-separated in-flight request counts for the rate runs");
  app.add_option("--bin-dir", bin_dir, "where tailserve-router and tailserve-worker are");
  CLI11_PARSE(app, argc, argv);

  const std::string dir = std::filesystem::temp_directory_path() / ("tailserve-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::string> zero_cost = {"--set", "worker.sim.step_base_ms=0", "--set", "worker.sim.step_per_sequence_ms=0",
                                              "--set", "worker.sim.step_per_kv_token_ns=0", "--set",
                                              "worker.sim.step_per_prefill_token_ms=0", "--slots", "512"};
  std::vector<std::unique_ptr<Subprocess>> workers;
  std::vector<std::string> targets;
  for (int i = 0; i < 2; ++i) {
    auto w = std::make_unique<Subprocess>();
    std::vector<std::string> argv = {bin_dir + "/tailserve-worker", "--grpc-port", "0", "--http-port", "0",
                                     "--listen-host", "127.0.0.1", "--log-level", "warn",
                                     "--ports-file", absl::StrCat(dir, "/w", i)};
    argv.insert(argv.end(), zero_cost.begin(), zero_cost.end());
    if (!w->Start(argv, absl::StrCat(dir, "/w", i, ".log")).ok()) return 1;
    auto port = WaitForPort(absl::StrCat(dir, "/w", i), "grpc_port", std::chrono::seconds(10));
    if (!port.ok()) return 1;
    targets.push_back(absl::StrCat("127.0.0.1:", *port));
    workers.push_back(std::move(w));
  }
  // No batch-formation wait: this measures routing cost, not the batching policy's deliberate wait.
  Subprocess router;
  if (!router.Start({bin_dir + "/tailserve-router", "--grpc-port", "0", "--http-port", "0", "--listen-host",
                     "127.0.0.1", "--log-level", "warn", "--ports-file", dir + "/r", "--workers",
                     targets[0] + "," + targets[1], "--set", "router.timeout_ms=0", "--set",
                     "batching.min_batch_size=1", "--set", "router.max_queue_size=100000",
                     "--set", "router.health_check_interval_ms=100"},
                    dir + "/r.log")
           .ok()) {
    return 1;
  }
  auto rport = WaitForPort(dir + "/r", "grpc_port", std::chrono::seconds(10));
  if (!rport.ok()) return 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // first health polls

  auto worker_stub = v1::Worker::NewStub(grpc::CreateChannel(targets[0], grpc::InsecureChannelCredentials()));
  auto router_stub =
      v1::Generation::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", *rport), grpc::InsecureChannelCredentials()));

  auto direct = [&](int i) {
    v1::Batch b;
    v1::Sequence* s = b.add_sequences();
    s->set_sequence_id(1'000'000 + i);
    for (int k = 0; k < 16; ++k) s->add_prompt_token_ids((k * 13 + i) % 256);
    s->set_max_tokens(1);
    s->mutable_sampling()->set_seed(i);
    grpc::ClientContext ctx;
    const auto t0 = Clock::now();
    auto reader = worker_stub->Execute(&ctx, b);
    v1::TokenEvent ev;
    while (reader->Read(&ev)) {
    }
    const bool ok = reader->Finish().ok();
    return ok ? Ms(Clock::now() - t0) : -1.0;
  };
  auto routed = [&](int i) {
    grpc::ClientContext ctx;
    const auto t0 = Clock::now();
    auto reader = router_stub->Generate(&ctx, OneToken(i, 1));
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    const bool ok = reader->Finish().ok();
    return ok ? Ms(Clock::now() - t0) : -1.0;
  };
  // Warm both paths, then interleave so drift in machine load hits both equally.
  for (int i = 0; i < 200; ++i) {
    direct(i);
    routed(i);
  }
  std::vector<double> a, b;
  for (int i = 0; i < requests; ++i) {
    const double x = direct(i), y = routed(i);
    if (x < 0 || y < 0) {
      std::fprintf(stderr, "request %d failed\n", i);
      return 1;
    }
    a.push_back(x);
    b.push_back(y);
  }
  std::printf("## Router overhead, 1-token requests sent one at a time (n=%d, zero-cost sim workers)\n\n", requests);
  std::printf("| path | P50 ms | P90 ms | P99 ms |\n|---|---:|---:|---:|\n");
  std::printf("| client -> worker Execute | %.3f | %.3f | %.3f |\n", Percentile(a, .5), Percentile(a, .9), Percentile(a, .99));
  std::printf("| client -> router -> worker | %.3f | %.3f | %.3f |\n", Percentile(b, .5), Percentile(b, .9), Percentile(b, .99));
  std::printf("| added by the router | %.0f us | %.0f us | %.0f us |\n\n", 1e3 * (Percentile(b, .5) - Percentile(a, .5)),
              1e3 * (Percentile(b, .9) - Percentile(a, .9)), 1e3 * (Percentile(b, .99) - Percentile(a, .99)));

  std::printf("## Sustained rate, closed loop (%.0f s per row)\n\n", seconds);
  std::printf("| in flight | output tokens/req | req/s | tokens/s | P50 ms | P99 ms | failed |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& c : absl::StrSplit(concurrency, ',')) {
    const int n = std::stoi(std::string(c));
    for (int tokens : {1, 16}) {
      ClosedLoop loop(router_stub.get(), tokens);
      const ClosedLoop::Result r = loop.Run(n, seconds);
      std::printf("| %d | %d | %.0f | %.0f | %.2f | %.2f | %lld |\n", n, tokens, r.ok / r.seconds, r.tokens / r.seconds,
                  Percentile(r.latency_ms, .5), Percentile(r.latency_ms, .99), static_cast<long long>(r.failed));
      if (!loop.first_error_.empty()) std::fprintf(stderr, "first error: %s\n", loop.first_error_.c_str());
      std::fflush(stdout);
    }
  }
  router.Stop();
  for (auto& w : workers) w->Stop();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) { return tailserve::Main(argc, argv); }
