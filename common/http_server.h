#pragma once
// The observability endpoint of each process: /metrics, /healthz, /readyz on one HTTP port.
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace tailserve {

class Registry;

// What the probes answer: OK, or the reason (served as 503). `ready` (/readyz): the process should
// receive traffic. `live` (/healthz): the process can still serve at all; when it says no, an
// orchestrator restarts it. Empty: always OK.
struct Probes {
  std::function<absl::Status()> ready;
  std::function<absl::Status()> live;
};

class ObservabilityServer {
 public:
  ObservabilityServer(const Registry& registry, Probes probes);
  ~ObservabilityServer();

  // Binds host:port (0 picks a free port) and serves on a background thread. Returns the port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  void Stop();

 private:
  const Registry& registry_;
  Probes probes_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace tailserve
