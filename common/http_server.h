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

class ObservabilityServer {
 public:
  // `ready` returns OK when the process should receive traffic, else the reason (served as 503).
  ObservabilityServer(const Registry& registry, std::function<absl::Status()> ready);
  ~ObservabilityServer();

  // Binds host:port (0 picks a free port) and serves on a background thread. Returns the port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  void Stop();

 private:
  const Registry& registry_;
  std::function<absl::Status()> ready_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace tailserve
