// tailserve-router: the stateless front end. Validates, tokenizes, batches and dispatches to
// workers, relays their token streams.
#include <spdlog/spdlog.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/process.h"
#include "common/tls.h"
#include "router/generation_service.h"
#include "router/http/api_server.h"
#include "router/http/model_info.h"
#include "router/model_tokenizer.h"
#include "router/predictor/onnx_model.h"
#include "router/router_core.h"

namespace tailserve {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"tailserve router: validates, batches and dispatches generation requests to workers"};
  CommonFlags common;
  AddCommonFlags(app, &common, "router");
  app.add_option_function<std::string>(
      "--workers",
      [&common](const std::string& v) {
        std::vector<std::string> list = absl::StrSplit(v, ',', absl::SkipEmpty());
        for (auto& w : list) w = "\"" + w + "\"";
        common.shorthands.push_back(absl::StrCat("router.workers=[", absl::StrJoin(list, ","), "]"));
      },
      "worker gRPC endpoints, comma-separated host:port (sets router.workers)");
  AddPathShorthand(app, &common, "--model", "router.model_path",
                   "checkpoint directory whose tokenizer and context length the router uses");
  CLI11_PARSE(app, argc, argv);
  std::optional<Config> config = InitProcess("router", common);
  if (!config) return 2;
  if (config->router.workers.empty()) {
    spdlog::critical("invalid configuration: router.workers: at least one worker address is needed");
    return 2;
  }

  Registry registry;
  RouterMetrics metrics(registry, config->router.metrics_window_seconds);
  // The served model's tokenizer, or one id per byte for sim clusters.
  std::unique_ptr<Tokenizer> tokenizer = std::make_unique<ByteTokenizer>();
  if (!config->router.model_path.empty()) {
    auto loaded = ModelTokenizer::Load(config->router.model_path);
    if (!loaded.ok()) {
      spdlog::critical("invalid configuration: router.model_path: {}", std::string(loaded.status().message()));
      return 2;
    }
    // A prompt must leave the model room for at least one new token.
    const int limit = std::min(config->router.max_prompt_tokens, (*loaded)->max_context() - 1);
    spdlog::info("tokenizer from {}: vocab {}, context {} (prompts up to {} tokens)", config->router.model_path,
                 (*loaded)->vocab_size(), (*loaded)->max_context(), limit);
    config->router.max_prompt_tokens = limit;
    tokenizer = *std::move(loaded);
  }
  std::vector<std::unique_ptr<WorkerClient>> clients;
  const RouterConfig& rc = config->router;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> worker_credentials = GrpcChannelCredentials(
      {.cert_file = rc.worker_tls_cert_file, .key_file = rc.worker_tls_key_file, .ca_file = rc.worker_tls_ca_file},
      "router.worker_tls_");
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> client_credentials =
      GrpcServerCredentials({.cert_file = rc.tls_cert_file, .key_file = rc.tls_key_file, .ca_file = ""}, "router.tls_");
  for (const absl::Status& s : {worker_credentials.status(), client_credentials.status()}) {
    if (!s.ok()) {
      spdlog::critical("invalid configuration: {}", std::string(s.message()));
      return 2;
    }
  }
  for (const auto& w : config->router.workers) clients.push_back(MakeGrpcWorkerClient(w, *worker_credentials));
  std::unique_ptr<LengthModel> model;
  if (!config->predictor.model_path.empty()) {
    auto loaded = OnnxModel::Load(config->predictor.model_path, kFeatureInputName, kNumFeatures);
    if (!loaded.ok()) {
      spdlog::critical("invalid configuration: predictor.model_path: {}", std::string(loaded.status().message()));
      return 2;
    }
    spdlog::info("length predictor: {}", (*loaded)->Describe());
    model = *std::move(loaded);
  }
  RouterCore core(*config, config->router.workers, std::move(clients),
                  MakeBatcher(config->batching, config->router),
                  std::make_unique<LengthPredictor>(config->predictor, std::move(model), metrics), *tokenizer, metrics);
  // API keys: loaded now (a bad file stops the start), then re-read every 2 s; a bad edit keeps the
  // keys in force and says why.
  std::unique_ptr<ApiKeys> keys;
  if (!config->router.api_keys_file.empty()) {
    keys = std::make_unique<ApiKeys>();
    if (absl::Status s = keys->ReloadIfChanged(config->router.api_keys_file); !s.ok()) {
      spdlog::critical("invalid configuration: {}", std::string(s.message()));
      return 2;
    }
    spdlog::info("API keys: {} from {}", keys->size(), config->router.api_keys_file);
  }
  GenerationService service(core, config->router, *tokenizer, metrics, SystemClock::Get(), keys.get());
  absl::StatusOr<Servers> servers = StartServers(
      config->router.listen_host, config->router.grpc_port, config->router.http_port, {&service}, registry,
      {.ready = [&]() -> absl::Status {
         return core.ready() ? absl::OkStatus() : absl::UnavailableError("no healthy worker");
       },
       .live = {}},  // alive while it answers: the router holds no device
      common.ports_file, 4 << 20, *client_credentials);
  if (!servers.ok()) {
    spdlog::critical("{}", std::string(servers.status().message()));
    return 1;
  }
  // gRPC health says what /readyz says: SERVING while at least one worker is in rotation.
  core.OnReadinessChange([&servers](bool ready) { servers->SetServing(ready); });
  core.Start();
  spdlog::info("router listening: grpc {}:{} http {}:{}; workers: {}", config->router.listen_host, servers->grpc_port,
               config->router.listen_host, servers->http_port, absl::StrJoin(config->router.workers, ", "));
  // The OpenAI-compatible HTTP API, on its own port.
  std::unique_ptr<http::ServedModel> served = http::LoadServedModel(config->router);
  std::unique_ptr<http::ApiServer> api;
  if (config->router.api_port >= 0) {
    api = std::make_unique<http::ApiServer>(core, config->router, *tokenizer, metrics, served->info, keys.get());
    absl::StatusOr<int> port = api->Start(config->router.listen_host, config->router.api_port);
    if (!port.ok()) {
      spdlog::critical("{}", std::string(port.status().message()));
      core.Stop();
      servers->Shutdown(std::chrono::seconds(1));
      return 1;
    }
    if (!common.ports_file.empty()) {
      std::ofstream(common.ports_file, std::ios::app) << "api_port=" << *port << "\n";
    }
    spdlog::info("OpenAI API on http://{}:{}/v1 serving model '{}'", config->router.listen_host, *port, served->info.name);
  }

  if (rc.tls_cert_file.empty() && rc.listen_host != "127.0.0.1" && rc.listen_host != "localhost" && rc.listen_host != "::1") {
    spdlog::warn("the client gRPC API listens on {} without TLS (router.tls_cert_file): requests and tokens cross the "
                 "network in the clear",
                 rc.listen_host);
  }
  if (!keys && config->router.listen_host != "127.0.0.1" && config->router.listen_host != "localhost" &&
      config->router.listen_host != "::1") {
    spdlog::warn("the client APIs listen on {} without API keys (router.api_keys_file): anyone who reaches the ports "
                 "can use them",
                 config->router.listen_host);
  }
  std::atomic<bool> stop_reload{false};
  std::thread reload;
  if (keys) {
    reload = std::thread([&] {
      while (!stop_reload.load()) {
        for (int i = 0; i < 20 && !stop_reload.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const size_t before = keys->size();
        if (absl::Status s = keys->ReloadIfChanged(config->router.api_keys_file); !s.ok()) {
          spdlog::error("API keys not reloaded (the previous ones stay): {}", std::string(s.message()));
        } else if (keys->size() != before) {
          spdlog::info("API keys reloaded: {}", keys->size());
        }
      }
    });
  }
  const int sig = WaitForTermination();
  stop_reload = true;
  if (reload.joinable()) reload.join();
  spdlog::info("signal {}: shutting down", sig);
  servers->SetServing(false);
  core.Stop();
  if (api) api->Stop();
  servers->Shutdown(std::chrono::seconds(5));
  return 0;
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) { return tailserve::Main(argc, argv); }
