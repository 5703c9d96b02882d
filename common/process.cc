#include "common/process.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include "absl/strings/str_cat.h"

namespace tailserve {

void AddCommonFlags(CLI::App& app, CommonFlags* flags) {
  app.add_option("--config", flags->config_path, "ladb_config.yaml to load (default: built-in defaults)");
  app.add_option("--set", flags->overrides, "Override a config key: --set router.timeout_ms=100 (repeatable)");
  app.add_option("--ports-file", flags->ports_file, "Write grpc_port=/http_port= here once listening");
  app.add_option("--log-level", flags->log_level, "trace, debug, info, warn, error, critical, off");
}

absl::StatusOr<Config> LoadConfig(const CommonFlags& flags, const std::vector<std::string>& extra) {
  std::vector<std::string> all = flags.overrides;
  all.insert(all.end(), extra.begin(), extra.end());
  if (flags.config_path.empty()) return ParseConfig("", all, "<defaults>");
  return LoadConfigFile(flags.config_path, all);
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTermination() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& host, int port,
                                           const std::vector<grpc::Service*>& services) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  GrpcServer out;
  builder.AddListeningPort(absl::StrCat(host, ":", port), grpc::InsecureServerCredentials(), &out.port);
  for (grpc::Service* s : services) builder.RegisterService(s);
  out.server = builder.BuildAndStart();
  if (!out.server || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", host, ":", port));
  }
  return out;
}

}  // namespace tailserve
