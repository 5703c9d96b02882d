#pragma once
// Typed configuration for both processes, parsed from ladb_config.yaml and validated at start.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tailserve {

struct BatchingConfig {
  // ladb (length-aware batches), fifo (arrival order, batched), fcfs (each request at once, no
  // prediction: the stock baseline) or slo (each request at once to the worker with the least
  // predicted TTFT, its prediction, priority and wait sent for the worker's queue to order by).
  std::string mode = "slo";
  int max_batch_size = 32;
  int min_batch_size = 4;
  int target_latency_ms = 350;
  double variance_tolerance = 0.05;
};

struct PredictorConfig {
  // Rule-based prediction of decode steps: steps = steps_per_prompt_token * prompt + base_steps,
  // capped at max_tokens.
  double steps_per_prompt_token = 0.8;
  double base_steps = 5;
  // Step budget per dispatch = ceil(prediction * (1 + margin)); a sequence that spends it is
  // returned unfinished and re-queued with a doubled budget. Negative disables budgets.
  double step_budget_margin = 0.2;
  int min_step_budget = 16;
  // ONNX model (features -> steps); empty: the rule alone.
  std::string model_path;
  // Finished requests observed in shadow mode before the model drives batching.
  int warmup_steps = 500;
  // How often the per-bucket residual correction is refreshed from feedback.
  int update_interval_ms = 10000;
  // JSON lines of (features, actual steps) for retraining; empty: none.
  std::string feedback_log;
  // Drift: the window MAPE of the model above mape_threshold (with at least min_samples) switches
  // batching to FIFO and predictions to the rule for cooldown_s; back once the window recovers.
  double drift_mape_threshold = 0.8;
  double drift_window_s = 300;
  double drift_cooldown_s = 300;
  int drift_min_samples = 200;
};

struct RouterConfig {
  std::string listen_host = "0.0.0.0";
  int grpc_port = 50051;
  int http_port = 9090;
  std::vector<std::string> workers;  // host:port of each worker's gRPC endpoint
  std::string queue_strategy = "priority_by_remaining_steps";
  int timeout_ms = 200;
  // Bounded wait: a request queued this long goes before every class and shorter prediction.
  int max_wait_ms = 2000;
  std::string fallback_policy = "immediate_dispatch";
  int max_queue_size = 1024;
  int max_tokens_limit = 4096;
  int max_prompt_tokens = 8192;
  int max_failed_dispatches = 3;
  int health_check_interval_ms = 1000;
  int health_check_timeout_ms = 500;
  int unhealthy_after_failures = 2;
  double metrics_window_seconds = 60;
  // Per-class SLO defaults in ms (a request's own ttft_slo_ms / tpot_slo_ms override them; 0: no
  // objective), and the early rejection of batching.mode slo: once slo_reject_waiting requests are
  // queued on the best worker for their first token (0: never reject), a request whose predicted TTFT there
  // misses its objective is refused at once (RESOURCE_EXHAUSTED, with a retry-after hint), and a
  // batch-priority request is refused whatever its objective.
  int interactive_ttft_slo_ms = 500;
  int interactive_tpot_slo_ms = 50;
  int standard_ttft_slo_ms = 1000;
  int standard_tpot_slo_ms = 50;
  int batch_ttft_slo_ms = 0;
  int batch_tpot_slo_ms = 0;
  int slo_reject_waiting = 8;
  // Cache-aware placement (batching.mode slo): a worker's predicted TTFT counts only the prompt
  // tokens its prefix cache does not hold, as learned from the router's own placements (up to
  // prefix_index_blocks 16-token blocks a worker, least recently routed forgotten first).
  bool cache_aware_routing = true;
  int prefix_index_blocks = 65536;
  // Cache-aware placement follows what each worker's cache stored and evicted (its events, in the
  // status it answers every health_check_interval_ms) once it sends them; false: the router's own
  // placements only.
  bool prefix_cache_events = true;
  // batching.mode slo: a request with a session_id whose prompt no worker is known to hold goes
  // where its session's last request went, unless that worker's predicted TTFT is more than one
  // of its steps above the best (the session's cached turns there will likely save more).
  bool session_affinity = true;
  // batching.mode slo: a worker whose sequences would exceed this multiple of the workers' mean
  // (plus one) takes no new request while another has room below it, so a hot prefix cached on
  // one worker cannot pin the traffic there. 0: off.
  double max_load_imbalance = 1.25;
  // Checkpoint directory whose tokenizer.json (text prompts, streamed text) and context length the
  // router uses; empty: a byte tokenizer (sim clusters).
  std::string model_path;
  // The OpenAI-compatible HTTP API (router/http): its port (-1: off; 0: a free one, written to
  // --ports-file as api_port=), the threads serving it, the largest request body, and the model name
  // it answers to (empty: model_path's folder name, or "sim").
  int api_port = -1;
  int api_threads = 2;
  int api_max_body_bytes = 4 << 20;
  std::string served_model_name;
  // API keys the client APIs (gRPC and HTTP) require, one per line as router/auth/api_keys.h
  // describes, reloaded when the file changes; empty: no keys.
  std::string api_keys_file;
  // TLS on the client gRPC API (PEM files, re-read while serving; empty: plaintext).
  std::string tls_cert_file, tls_key_file;
  // TLS to the workers: the CA their certificates chain to, and the router's own certificate and
  // key for mutual TLS (workers that require client certificates). Empty: plaintext.
  std::string worker_tls_ca_file, worker_tls_cert_file, worker_tls_key_file;
};

// Defaults: fitted to the CUDA engine on an H200, Llama-3.1-8B shape, FP8 KV (bench/RESULTS.md).
struct SimBackendConfig {
  double step_base_ms = 3.83;            // a
  double step_per_sequence_ms = 0.018;   // b
  double step_per_kv_token_ns = 18.7;    // c
  double step_per_prefill_token_ms = 0.031;  // p
  int vocab_size = 256;
  // Paged KV cache accounted in blocks of 16 positions, as the CUDA engine's (0: unlimited).
  int kv_blocks = 0;
  // Fault injection, for failover tests: every step after this many fails as a device fault
  // would (0: never).
  int fail_after_steps = 0;
};

struct WorkerConfig {
  std::string listen_host = "0.0.0.0";
  int grpc_port = 50061;
  int http_port = 9091;
  std::string backend = "sim";
  std::string model_id = "sim";
  // HuggingFace checkpoint directory the cpu backend serves.
  std::string model_path;
  int threads = 0;  // cpu backend: BLAS threads, 0 = the library's default
  // cuda backend.
  std::string kv_cache_dtype = "fp8_e4m3";
  double kv_memory_fraction = 0.9;
  int max_context = 0;  // 0: the model's max_position_embeddings
  int cuda_device = 0;
  int slots = 64;
  // The most new tokens an engine step computes: decodes first, then prompts, a long one in chunks
  // over several steps. 0: every prompt whole in one step.
  int step_token_budget = 512;
  // A step-time target in ms (0: none): each step prefills as many tokens as the worker's learned
  // step cost says fit it (at least step_token_budget's share), so decoding sequences' time per
  // output token stays near the target while prompts take all the room it leaves.
  double step_time_target_ms = 25;
  // Sequences accepted beyond the free slots, waiting for a slot and KV cache (0: a batch that does
  // not fit the free slots now is refused, RESOURCE_EXHAUSTED).
  int max_waiting = 256;
  // The waiting queue's order: fcfs (arrival) or predicted (least predicted remaining work first,
  // by priority; aged sequences first). worker/scheduling_policy.h.
  std::string admission = "predicted";
  // A sequence waiting this long since its request arrived goes first (predicted admission).
  int aging_ms = 2000;
  // KV cache promised at admission: max_tokens (all of it), on_demand (grown a block at a time) or
  // predicted (the predicted output plus kv_reservation_margin, then on demand).
  std::string kv_reservation = "predicted";
  double kv_reservation_margin = 0.2;
  // Which running sequence gives up its KV cache (and is recomputed later) when it runs out:
  // newest, or most_remaining (lowest priority, then most predicted work left).
  std::string preemption = "most_remaining";
  // Automatic prefix caching: a new sequence reuses the KV blocks of any earlier sequence whose
  // tokens it begins with (worker/kv/kv_block_allocator.h); the sim needs sim.kv_blocks for it.
  bool prefix_caching = true;
  double metrics_window_seconds = 60;
  SimBackendConfig sim;
  // TLS on the worker's gRPC server (PEM, re-read while serving); with tls_client_ca_file only
  // clients (routers) with a certificate from that CA are served (mutual TLS). Empty: plaintext.
  std::string tls_cert_file, tls_key_file, tls_client_ca_file;
};

struct Config {
  BatchingConfig batching;
  PredictorConfig predictor;
  RouterConfig router;
  WorkerConfig worker;
};

// Parses YAML text. `overrides` are "section.key=value" strings (the value is YAML) applied before
// validation, so flags get exactly the checks the file gets. Errors name the key and the reason.
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text,
                                   const std::vector<std::string>& overrides = {},
                                   const std::string& source = "<config>");
absl::StatusOr<Config> LoadConfigFile(const std::string& path,
                                      const std::vector<std::string>& overrides = {});

}  // namespace tailserve
