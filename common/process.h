#pragma once
// Start-up pieces both binaries share: the common flags, config loading with flag overrides,
// termination signals, and the gRPC server with health checking and reflection.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "common/config.h"

namespace tailserve {

struct CommonFlags {
  std::string config_path;             // empty: built-in defaults
  std::vector<std::string> overrides;  // --set section.key=value
  std::string ports_file;              // where to announce bound ports
  std::string log_level = "info";
};

void AddCommonFlags(CLI::App& app, CommonFlags* flags);

// Loads the config file (if any) and applies --set overrides, then `extra` (from named flags).
absl::StatusOr<Config> LoadConfig(const CommonFlags& flags, const std::vector<std::string>& extra);

// Call before any thread starts so SIGTERM/SIGINT reach only WaitForTermination.
void BlockTerminationSignals();
int WaitForTermination();

// A started gRPC server with grpc.health.v1.Health and reflection; `port` 0 picks a free port.
struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& host, int port,
                                           const std::vector<grpc::Service*>& services);

}  // namespace tailserve
