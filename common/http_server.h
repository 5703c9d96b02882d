#pragma once
// The observability endpoint of each process: /metrics, /healthz, /readyz on one HTTP port. An
// asynchronous server (Boost.Beast) on one thread: a connection holds a socket, not a thread, and
// must send its whole request within kRequestDeadline, so slow or idle clients (slowloris) cannot
// keep the probes from being answered; past kMaxConnections new connections are closed at once.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tailserve {

class Registry;

// What the probes answer: OK, or the reason (served as 503). `ready` (/readyz): the process should
// receive traffic. `live` (/healthz): the process can still serve at all; when it says no, an
// orchestrator restarts it. Empty: always OK. Called on the server's thread: they must not block.
struct Probes {
  std::function<absl::Status()> ready;
  std::function<absl::Status()> live;
};

class ObservabilityServer {
 public:
  static constexpr std::chrono::seconds kRequestDeadline{5};  // a whole request, or a kept connection's wait for the next
  static constexpr int kMaxConnections = 512;

  ObservabilityServer(const Registry& registry, Probes probes);
  ~ObservabilityServer();

  // Binds host:port (0 picks a free port) and serves on a background thread. Returns the port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tailserve
