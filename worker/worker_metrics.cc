#include "worker/worker_metrics.h"

namespace tailserve {

WorkerMetrics::WorkerMetrics(Registry& r, double window_seconds)
    : step_time(r.AddHistogram("tailserve_worker_step_time_seconds",
                               "Duration of one scheduler step (prefill and/or one decode token for the running batch).",
                               StepTimeBuckets())
                    .Get()),
      step_time_window(r.AddWindowQuantiles("tailserve_worker_step_time_window_seconds",
                                            "Step time quantiles over the sliding metrics window.", window_seconds)
                           .Get()),
      running_sequences(r.AddGauge("tailserve_worker_running_sequences", "Sequences holding a slot.").Get()),
      free_slots(r.AddGauge("tailserve_worker_free_slots", "Slots free for new sequences.").Get()),
      total_slots(r.AddGauge("tailserve_worker_slots", "Configured sequence slots.").Get()),
      ready(r.AddGauge("tailserve_worker_ready", "1 once the engine has completed its warm-up generation.").Get()),
      step_batch_size(r.AddHistogram("tailserve_worker_step_batch_size", "Sequences in one step.",
                                     {1, 2, 4, 8, 16, 32, 64, 128, 256, 512})
                          .Get()),
      prefill_tokens(r.AddCounter("tailserve_worker_prefill_tokens_total", "Tokens prefilled (prompts and re-dispatched output).").Get()),
      step_prefill_tokens(r.AddHistogram("tailserve_worker_step_prefill_tokens",
                                         "Prompt tokens one step prefills (bounded by worker.step_token_budget).",
                                         {0, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384})
                              .Get()),
      waiting_sequences(
          r.AddGauge("tailserve_worker_waiting_sequences", "Sequences accepted and waiting for a slot or KV cache.")
              .Get()),
      queue_wait(r.AddHistogram("tailserve_worker_queue_wait_seconds",
                                "Time from a sequence's arrival at the worker (or its preemption) to holding a slot.",
                                LatencyBuckets())
                     .Get()),
      preemptions(r.AddCounter("tailserve_worker_preemptions_total",
                               "Running sequences that gave up their KV cache for another and wait to be recomputed.")
                      .Get()),
      prefix_queried_tokens(r.AddCounter("tailserve_worker_prefix_cache_queried_tokens_total",
                                         "Tokens of admitted sequences looked up in the prefix cache.")
                                .Get()),
      prefix_hit_tokens(r.AddCounter("tailserve_worker_prefix_cache_hit_tokens_total",
                                     "Tokens of admitted sequences found in the prefix cache (not computed).")
                            .Get()),
      kv_blocks_cached(r.AddGauge("tailserve_worker_kv_blocks_cached",
                                  "Free KV blocks that still hold a cached prefix (counted as free).")
                           .Get()),
      kv_evictions(r.AddCounter("tailserve_worker_kv_evictions_total",
                                "Cached KV blocks evicted to make room for new ones.")
                       .Get()),
      generated_tokens(r.AddCounter("tailserve_worker_generated_tokens_total", "Tokens generated.").Get()),
      batches(r.AddCounter("tailserve_worker_batches_total", "Execute calls by outcome (admitted, rejected_full, rejected_kv, rejected_engine_failed, invalid).",
                           {"outcome"})),
      sequences(r.AddCounter("tailserve_worker_sequences_total",
                             "Sequences that left their slot, by reason (stop, length, budget, cancelled, error), or were refused (invalid).",
                             {"reason"})),
      step_cost(r.AddGauge("tailserve_worker_step_cost_seconds",
                           "The step cost learned from recent steps, seconds = base + per_sequence x sequences + "
                           "per_kv_token x KV tokens + per_prefill_token x prefill tokens, by term.",
                           {"term"})),
      kv_blocks(r.AddGauge("tailserve_worker_kv_blocks", "Paged KV-cache blocks by state (used, free).", {"state"})),
      kv_clamps(r.AddCounter("tailserve_worker_kv_clamps_total",
                             "KV-cache values clamped to the cache dtype's range (FP8/FP16) instead of overflowing.")
                    .Get()),
      graph_replays(r.AddCounter("tailserve_worker_graph_replays_total", "Decode steps run as one CUDA graph replay.")
                        .Get()) {}

void WorkerMetrics::Publish(const EngineStats& s) {
  kv_blocks.Labels({"used"}).Set(static_cast<double>(s.kv_blocks_total - s.kv_blocks_free));
  kv_blocks.Labels({"free"}).Set(static_cast<double>(s.kv_blocks_free));
  kv_blocks_cached.Set(static_cast<double>(s.kv_blocks_cached));
  kv_evictions.Inc(static_cast<double>(s.kv_evictions) - kv_evictions.Value());
  kv_clamps.Inc(static_cast<double>(s.kv_clamps) - kv_clamps.Value());
  graph_replays.Inc(static_cast<double>(s.graph_replays) - graph_replays.Value());
}

}  // namespace tailserve
