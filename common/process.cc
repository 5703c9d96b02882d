#include "common/process.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/subprocess.h"

namespace tailserve {

void AddCommonFlags(CLI::App& app, CommonFlags* flags, const std::string& section) {
  app.add_option("--config", flags->config_path, "ladb_config.yaml to load (default: built-in defaults)");
  app.add_option("--set", flags->overrides, "Override a config key: --set router.timeout_ms=100 (repeatable)");
  app.add_option("--ports-file", flags->ports_file, "Write grpc_port=/http_port= here once listening");
  app.add_option("--log-level", flags->log_level, "trace, debug, info, warn, error, critical, off");
  app.add_flag("--check-config", flags->check_config,
               "Validate the configuration (file, --set and shorthands), print the verdict and exit (0: valid)");
  AddShorthand(app, flags, "--grpc-port", section + ".grpc_port", "gRPC port (0: any free port)");
  AddShorthand(app, flags, "--http-port", section + ".http_port", "HTTP port for /metrics /healthz /readyz (0: any)");
  AddShorthand(app, flags, "--listen-host", section + ".listen_host", "address to bind");
}

void AddShorthand(CLI::App& app, CommonFlags* flags, const std::string& flag, const std::string& key,
                  const std::string& help) {
  app.add_option_function<std::string>(
      flag, [flags, key](const std::string& v) { flags->shorthands.push_back(key + "=" + v); },
      help + " (sets " + key + ")");
}

void AddPathShorthand(CLI::App& app, CommonFlags* flags, const std::string& flag, const std::string& key,
                      const std::string& help) {
  app.add_option_function<std::string>(
      flag,
      [flags, key](const std::string& v) {
        // A path on the command line is relative to where the process starts, not to the config file.
        const std::string abs = std::filesystem::absolute(v).lexically_normal().string();
        flags->shorthands.push_back(key + "=" + nlohmann::json(abs).dump());
      },
      help + " (sets " + key + ")");
}

std::optional<Config> InitProcess(const std::string& name, const CommonFlags& flags) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (!InitLogging(name, flags.log_level)) {
    std::fprintf(stderr, "--log-level: unknown level '%s'\n", flags.log_level.c_str());
    return std::nullopt;
  }
  // Every client connection and stream holds a descriptor: take the hard limit, not the soft one
  // (often 1024), which a few hundred streams would exhaust.
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  std::vector<std::string> all = flags.overrides;
  all.insert(all.end(), flags.shorthands.begin(), flags.shorthands.end());
  absl::StatusOr<Config> config =
      flags.config_path.empty() ? ParseConfig("", all, "<defaults>") : LoadConfigFile(flags.config_path, all);
  if (!config.ok()) {
    spdlog::critical("invalid configuration: {}", std::string(config.status().message()));
    if (flags.check_config) std::exit(2);
    return std::nullopt;
  }
  if (flags.check_config) {
    std::printf("configuration valid: %s\n", flags.config_path.empty() ? "<defaults>" : flags.config_path.c_str());
    std::exit(0);
  }
  return *std::move(config);
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

absl::StatusOr<Servers> StartServers(const std::string& host, int grpc_port, int http_port,
                                     const std::vector<grpc::Service*>& services, const Registry& registry,
                                     Probes probes, const std::string& ports_file, int max_receive_bytes,
                                     std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  Servers out;
  builder.AddListeningPort(absl::StrCat(host, ":", grpc_port),
                           credentials ? credentials : grpc::InsecureServerCredentials(), &out.grpc_port);
  builder.SetMaxReceiveMessageSize(max_receive_bytes);
  // Connections cost descriptors and memory whether or not they are used: a connection must finish
  // its handshake within 10 s, is closed after 2 idle minutes (clients reconnect on their own), and
  // carries at most kMaxStreamsPerConnection streams at once (more wait in the client).
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 120'000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  for (grpc::Service* s : services) builder.RegisterService(s);
  out.grpc = builder.BuildAndStart();
  if (!out.grpc || out.grpc_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", host, ":", grpc_port));
  }
  out.SetServing(false);
  // Not live once the gRPC listener stops answering (it may stop accepting for good after running
  // out of descriptors, while everything else still works): the orchestrator restarts the process.
  // A TLS listener answers the plaintext check with a failed handshake, which gRPC logs as an
  // error: checked every 30 s instead of every 5 s.
  out.grpc_watch = std::make_unique<ListenerWatch>(host, out.grpc_port,
                                                   credentials ? std::chrono::seconds(30) : std::chrono::seconds(5));
  probes.live = [watch = out.grpc_watch.get(), live = std::move(probes.live)]() -> absl::Status {
    if (absl::Status s = watch->Status(); !s.ok()) return s;
    return live ? live() : absl::OkStatus();
  };
  out.heap_trimmer = std::make_unique<HeapTrimmer>();
  out.http = std::make_unique<ObservabilityServer>(registry, std::move(probes));
  TAILSERVE_ASSIGN_OR_RETURN(out.http_port, out.http->Start(host, http_port));
  if (!ports_file.empty()) {
    TAILSERVE_RETURN_IF_ERROR(WritePortsFile(ports_file, out.grpc_port, out.http_port));
  }
  return out;
}

void Servers::Shutdown(std::chrono::milliseconds grace) {
  SetServing(false);
  grpc->Shutdown(std::chrono::system_clock::now() + grace);
  http->Stop();
}

}  // namespace tailserve
