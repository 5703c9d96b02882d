// tailserve-worker: one process per GPU (or per simulated GPU), serving tailserve.v1.Worker.
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/tls.h"
#include "common/status_macros.h"
#include "worker/backends/cpu/cpu_engine.h"
#include "worker/backends/sim/sim_engine.h"
#include "worker/scheduler.h"
#include "worker/worker_service.h"
#ifdef TAILSERVE_HAVE_CUDA
#include "worker/backends/cuda/cuda_engine.h"
#include "worker/backends/cuda/device_info.h"
#endif

namespace tailserve {
namespace {

// Marks the worker ready once a real generation has gone through the scheduler and engine.
class WarmupSink final : public BatchSink {
 public:
  WarmupSink(std::atomic<bool>& ready, Servers& servers, Gauge& gauge)
      : ready_(ready), servers_(servers), gauge_(gauge) {}
  void Write(v1::TokenEvent ev) override {
    for (const auto& s : ev.sequences()) tokens_ += s.token_ids_size();
  }
  void Finish(grpc::Status status) override {
    if (!status.ok() || tokens_ == 0) {
      spdlog::error("warm-up generation failed: {} ({} tokens)", status.error_message(), tokens_);
      return;
    }
    ready_ = true;
    gauge_.Set(1);
    servers_.SetServing(true);
    spdlog::info("warm-up generation done ({} tokens): ready", tokens_);
  }

 private:
  std::atomic<bool>& ready_;
  Servers& servers_;
  Gauge& gauge_;
  int tokens_ = 0;
};

void LogLoaded(const ModelConfig& c, const std::string& path, SteadyTime start) {
  spdlog::info("loaded {} from {} in {:.2f} s: {} layers, hidden {}, {} heads / {} KV heads, vocab {}{}",
               ArchitectureName(c.arch), path, Seconds(SystemClock::Get().Now() - start), c.num_layers, c.hidden_size,
               c.num_heads, c.num_kv_heads, c.vocab_size,
               c.num_experts ? absl::StrCat(", ", c.num_experts, " experts (top ", c.experts_per_token, ")") : "");
}

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const WorkerConfig& wc) {
  if (wc.backend == "sim") {
    return std::make_unique<SimEngine>(wc.sim, wc.model_id, SystemClock::Get(), nullptr, wc.prefix_caching);
  }
  if (wc.model_path.empty()) return absl::InvalidArgumentError("worker.model_path (--model) is required");
  const SteadyTime start = SystemClock::Get().Now();
  if (wc.backend == "cuda") {
#ifdef TAILSERVE_HAVE_CUDA
    TAILSERVE_ASSIGN_OR_RETURN(const KvDtype kv, ParseKvDtype(wc.kv_cache_dtype));
    CudaEngineOptions o{.kv_dtype = kv, .kv_memory_fraction = wc.kv_memory_fraction,
                        .max_sequences = std::max(256, wc.slots), .max_context = wc.max_context, .device = wc.cuda_device,
                        .prefix_caching = wc.prefix_caching, .tuning = {}};
    TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> cuda, CudaEngine::Load(wc.model_path, o));
    LogLoaded(cuda->config(), wc.model_path, start);
    for (const auto& [what, bytes] : cuda->memory()) spdlog::info("device memory: {} {:.2f} GiB", what, bytes / double(1 << 30));
    const EngineStats st = *cuda->stats();
    spdlog::info("KV cache: {} blocks of {} tokens ({}), graphs for batch buckets captured", st.kv_blocks_total,
                 cuda->options().block_size, wc.kv_cache_dtype);
    return std::unique_ptr<Engine>(std::move(cuda));
#else
    return absl::FailedPreconditionError("this build has no CUDA backend (configure with TAILSERVE_CUDA=ON)");
#endif
  }
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> cpu,
                             CpuEngine::Load(wc.model_path, {.threads = wc.threads,
                                                             .kv_emulation = std::nullopt,
                                                             .prefix_caching = wc.prefix_caching}));
  LogLoaded(cpu->config(), wc.model_path, start);
  return std::unique_ptr<Engine>(std::move(cpu));
}

int Main(int argc, char** argv) {
  CLI::App app{"tailserve worker: serves tailserve.v1.Worker over one engine backend"};
  CommonFlags common;
  AddCommonFlags(app, &common, "worker");
  AddShorthand(app, &common, "--slots", "worker.slots", "sequences running at once");
  AddShorthand(app, &common, "--backend", "worker.backend", "engine backend: sim, cpu or cuda");
  AddPathShorthand(app, &common, "--model", "worker.model_path", "HuggingFace checkpoint directory (cpu and cuda backends)");
  CLI11_PARSE(app, argc, argv);
  std::optional<Config> config = InitProcess("worker", common);
  if (!config) return 2;
  const WorkerConfig& wc = config->worker;
#ifdef TAILSERVE_HAVE_CUDA
  if (auto devices = ListCudaDevices(); devices.ok()) {
    for (const CudaDevice& d : *devices) {
      spdlog::info("CUDA device {}: {} (sm_{}{}, {:.1f} GiB)", d.index, d.name, d.sm_major, d.sm_minor,
                   d.total_memory / double(1 << 30));
    }
  } else {
    spdlog::info("no usable CUDA device: {}", std::string(devices.status().message()));
  }
#endif

  Registry registry;
  WorkerMetrics metrics(registry, wc.metrics_window_seconds);
  // Checked before the model loads: a TLS mistake should not cost a minute of loading first.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = GrpcServerCredentials(
      {.cert_file = wc.tls_cert_file, .key_file = wc.tls_key_file, .ca_file = wc.tls_client_ca_file}, "worker.tls_");
  if (!credentials.ok()) {
    spdlog::critical("invalid configuration: {}", std::string(credentials.status().message()));
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Engine>> loaded = MakeEngine(wc);
  if (!loaded.ok()) {
    spdlog::critical("cannot start the {} backend: {}", wc.backend, std::string(loaded.status().message()));
    return 1;
  }
  Engine& engine = **loaded;
  Scheduler scheduler(engine, wc.slots, metrics);
  scheduler.SetPolicy(PolicyFromConfig(wc), wc.max_waiting);  // the step-token budget with it

  std::atomic<bool> ready{false};
  WorkerService service(scheduler, engine, ready);
  absl::StatusOr<Servers> servers = StartServers(
      wc.listen_host, wc.grpc_port, wc.http_port, {&service}, registry,
      {.ready = [&]() -> absl::Status {
         TAILSERVE_RETURN_IF_ERROR(scheduler.EngineHealth());
         return ready ? absl::OkStatus() : absl::UnavailableError("engine warm-up generation has not completed");
       },
       // A failed engine step is a device fault (a sticky CUDA error stays until the process
       // ends): not live, so Kubernetes restarts the worker.
       .live = [&] { return scheduler.EngineHealth(); }},
      common.ports_file,
      // A batch carries each sequence's prompt and tokens so far: up to max_batch_size times the
      // context, past gRPC's 4 MB default, whose RESOURCE_EXHAUSTED a router takes for "full"
      // and retries forever. The worker's only client is the router.
      /*max_receive_bytes=*/-1, *credentials);
  if (!servers.ok()) {
    spdlog::critical("{}", std::string(servers.status().message()));
    return 1;
  }
  // Out of rotation at once: the router's Status poll sees ready false, gRPC health NOT_SERVING.
  scheduler.OnEngineFailure([&](const absl::Status&) {
    ready = false;
    metrics.ready.Set(0);
    servers->SetServing(false);
  });
  scheduler.Start();
  spdlog::info("worker listening: grpc {}:{} http {}:{} backend={} slots={}", wc.listen_host, servers->grpc_port,
               wc.listen_host, servers->http_port, engine.backend(), wc.slots);

  // Warm-up: one short real generation through the scheduler and engine before taking traffic.
  v1::Batch warmup;
  warmup.set_batch_id("warmup");
  v1::Sequence* seq = warmup.add_sequences();
  seq->set_sequence_id(~0ull);
  for (int32_t t : {1, 2, 3}) seq->add_prompt_token_ids(t % engine.vocab_size());
  seq->set_max_tokens(4);
  scheduler.Submit(std::make_shared<WarmupSink>(ready, *servers, metrics.ready), warmup);

  const int sig = WaitForTermination();
  spdlog::info("signal {}: handing back running sequences and shutting down", sig);
  ready = false;
  metrics.ready.Set(0);
  servers->SetServing(false);
  scheduler.Stop();
  servers->Shutdown(std::chrono::seconds(5));
  return 0;
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) { return tailserve::Main(argc, argv); }
