#include "tests/cluster.h"

#include <httplib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tailserve {

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)) {
  char tmpl[] = "/tmp/tailserve-test-XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  workers_.resize(options_.workers);
  worker_extra_args_.resize(options_.workers);
  worker_grpc_.resize(options_.workers);
  worker_http_.resize(options_.workers);
}

Cluster::~Cluster() {
  if (router_) router_->Stop(std::chrono::milliseconds(2000));
  for (auto& w : workers_) {
    if (w) w->Stop(std::chrono::milliseconds(2000));
  }
  // Keep the logs of a failed run for CI: TAILSERVE_KEEP_TEST_DIRS=1 (debug knob).
  if (!std::getenv("TAILSERVE_KEEP_TEST_DIRS")) std::filesystem::remove_all(dir_);
}

absl::Status Cluster::StartWorker(size_t i) {
  const std::string ports = absl::StrCat(dir_, "/worker", i, ".ports");
  std::filesystem::remove(ports);
  std::vector<std::string> argv = {std::string(TAILSERVE_BIN_DIR) + "/tailserve-worker", "--grpc-port", "0",
                                   "--http-port", "0", "--listen-host", "127.0.0.1", "--ports-file", ports};
  argv.insert(argv.end(), options_.worker_args.begin(), options_.worker_args.end());
  argv.insert(argv.end(), worker_extra_args_[i].begin(), worker_extra_args_[i].end());
  workers_[i] = std::make_unique<Subprocess>();
  TAILSERVE_RETURN_IF_ERROR(workers_[i]->Start(argv, absl::StrCat(dir_, "/worker", i, ".log")));
  absl::StatusOr<int> g = WaitForPort(ports, "grpc_port", std::chrono::seconds(15));
  absl::StatusOr<int> h = WaitForPort(ports, "http_port", std::chrono::seconds(1));
  TAILSERVE_RETURN_IF_ERROR(g.status());
  TAILSERVE_RETURN_IF_ERROR(h.status());
  worker_grpc_[i] = *g;
  worker_http_[i] = *h;
  return absl::OkStatus();
}

absl::Status Cluster::Start() {
  std::string workers;
  for (size_t i = 0; i < workers_.size(); ++i) {
    TAILSERVE_RETURN_IF_ERROR(StartWorker(i));
    absl::StrAppend(&workers, i ? "," : "", worker_target(i));
  }
  const std::string ports = dir_ + "/router.ports";
  std::vector<std::string> argv = {std::string(TAILSERVE_BIN_DIR) + "/tailserve-router",
                                   "--config", std::string(TAILSERVE_SOURCE_DIR) + "/ladb_config.yaml",
                                   "--grpc-port", "0", "--http-port", "0", "--listen-host", "127.0.0.1",
                                   "--ports-file", ports, "--workers", workers,
                                   "--set", "router.health_check_interval_ms=100"};
  argv.insert(argv.end(), options_.router_args.begin(), options_.router_args.end());
  router_ = std::make_unique<Subprocess>();
  TAILSERVE_RETURN_IF_ERROR(router_->Start(argv, dir_ + "/router.log"));
  absl::StatusOr<int> g = WaitForPort(ports, "grpc_port", std::chrono::seconds(15));
  absl::StatusOr<int> h = WaitForPort(ports, "http_port", std::chrono::seconds(1));
  TAILSERVE_RETURN_IF_ERROR(g.status());
  TAILSERVE_RETURN_IF_ERROR(h.status());
  router_grpc_ = *g;
  router_http_ = *h;
  return WaitHealthyWorkers(options_.workers);
}

absl::Status Cluster::WaitHealthyWorkers(int n, int timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string body;
  while (std::chrono::steady_clock::now() < end) {
    if (HttpGet(router_http_, "/metrics", &body) == 200 &&
        MetricValue(body, "tailserve_router_workers_healthy") == n) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("router never saw ", n, " healthy workers; last metrics:\n", body));
}

int HttpGet(int port, const std::string& path, std::string* body) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  auto res = client.Get(path.c_str());
  if (!res) return -1;
  if (body) *body = res->body;
  return res->status;
}

double MetricValue(const std::string& text, const std::string& series) {
  size_t at = 0;
  while ((at = text.find(series, at)) != std::string::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t after = at + series.size();
    if (line_start && after < text.size() && text[after] == ' ') return std::stod(text.substr(after + 1));
    at = after;
  }
  return std::nan("");
}

}  // namespace tailserve
