#pragma once
// Start-up pieces both binaries share: the common flags, config loading with flag overrides,
// termination signals, and the gRPC server with health checking and reflection.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/heap_trimmer.h"
#include "common/http_server.h"
#include "common/listener_watch.h"

namespace tailserve {

struct CommonFlags {
  std::string config_path;               // empty: built-in defaults
  std::vector<std::string> overrides;    // --set section.key=value
  std::vector<std::string> shorthands;   // from flags like --grpc-port, as section.key=value
  std::string ports_file;                // where to announce bound ports
  std::string log_level = "info";
  bool check_config = false;             // validate the configuration, say so, exit
};

// --config, --set, --ports-file, --log-level, and the shorthands --grpc-port, --http-port and
// --listen-host for `section` ("router" or "worker").
void AddCommonFlags(CLI::App& app, CommonFlags* flags, const std::string& section);
// A flag that sets one config key; its value is YAML and gets the same checks as the file.
void AddShorthand(CLI::App& app, CommonFlags* flags, const std::string& flag, const std::string& key,
                  const std::string& help);

// Everything before the servers start: blocks SIGTERM/SIGINT (so only WaitForTermination sees
// them; call before any thread starts), sets up logging, loads the config file with --set
// overrides and then the shorthands. On failure logs why and returns nullopt (exit code 2).
// Like AddShorthand for a filesystem path: the value is made absolute against the working directory.
void AddPathShorthand(CLI::App& app, CommonFlags* flags, const std::string& flag, const std::string& key,
                      const std::string& help);

std::optional<Config> InitProcess(const std::string& name, const CommonFlags& flags);
int WaitForTermination();

// A process's two listeners: gRPC (with grpc.health.v1.Health, NOT_SERVING until the owner says
// otherwise, and reflection) and the HTTP observability endpoint.
inline constexpr int kMaxStreamsPerConnection = 4096;

struct Servers {
  std::unique_ptr<grpc::Server> grpc;
  std::unique_ptr<ListenerWatch> grpc_watch;  // before http: its probe reads the watch
  std::unique_ptr<HeapTrimmer> heap_trimmer;
  std::unique_ptr<ObservabilityServer> http;
  int grpc_port = 0, http_port = 0;
  void SetServing(bool serving) { grpc->GetHealthCheckService()->SetServingStatus(serving); }
  // Stops accepting, cancels what is still open after `grace`, stops HTTP.
  void Shutdown(std::chrono::milliseconds grace);
};
// Port 0 picks a free port; the bound ports are written to `ports_file` when it is not empty.
// `max_receive_bytes`: the largest request message gRPC accepts (-1: no limit). `credentials`:
// the gRPC port's (common/tls.h; null: plaintext).
absl::StatusOr<Servers> StartServers(const std::string& host, int grpc_port, int http_port,
                                     const std::vector<grpc::Service*>& services, const Registry& registry,
                                     Probes probes, const std::string& ports_file, int max_receive_bytes = 4 << 20,
                                     std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

}  // namespace tailserve
