#pragma once
// A router and N sim workers as real processes on loopback ports chosen at run time, for the
// integration tests. Everything is killed when the Cluster goes away.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/subprocess.h"

namespace tailserve {

struct ClusterOptions {
  int workers = 2;
  std::vector<std::string> worker_args;  // extra flags for every worker
  std::vector<std::string> router_args;  // extra flags for the router
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options);
  ~Cluster();
  // Starts workers, then the router, and waits until every worker is in rotation.
  absl::Status Start();
  absl::Status StartWorker(size_t i);
  // More flags for worker i alone, after ClusterOptions::worker_args (call before Start).
  void AddWorkerArgs(size_t i, std::vector<std::string> args) { worker_extra_args_[i] = std::move(args); }
  // Waits until the router's tailserve_router_workers_healthy gauge equals n.
  absl::Status WaitHealthyWorkers(int n, int timeout_ms = 15000);

  std::string router_target() const { return "127.0.0.1:" + std::to_string(router_grpc_); }
  std::string worker_target(size_t i) const { return "127.0.0.1:" + std::to_string(worker_grpc_[i]); }
  int router_http() const { return router_http_; }
  int worker_http(size_t i) const { return worker_http_[i]; }
  Subprocess& worker(size_t i) { return *workers_[i]; }
  Subprocess& router() { return *router_; }
  const std::string& dir() const { return dir_; }

 private:
  ClusterOptions options_;
  std::string dir_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::vector<std::vector<std::string>> worker_extra_args_;
  std::unique_ptr<Subprocess> router_;
  std::vector<int> worker_grpc_, worker_http_;
  int router_grpc_ = 0, router_http_ = 0;
};

// GET http://127.0.0.1:port/path; returns the HTTP status and fills *body.
int HttpGet(int port, const std::string& path, std::string* body = nullptr);
// The value of the first sample line starting with `series` in a metrics text, or NaN.
double MetricValue(const std::string& text, const std::string& series);

}  // namespace tailserve
