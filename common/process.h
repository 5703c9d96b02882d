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

namespace tailserve {

struct CommonFlags {
  std::string config_path;               // empty: built-in defaults
  std::vector<std::string> overrides;    // --set section.key=value
  std::vector<std::string> shorthands;   // from flags like --grpc-port, as section.key=value
  std::string ports_file;                // where to announce bound ports
  std::string log_level = "info";
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
std::optional<Config> InitProcess(const std::string& name, const CommonFlags& flags);
int WaitForTermination();

// A started gRPC server with grpc.health.v1.Health and reflection; `port` 0 picks a free port.
struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& host, int port,
                                           const std::vector<grpc::Service*>& services);

}  // namespace tailserve
