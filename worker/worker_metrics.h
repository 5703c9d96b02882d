#pragma once
// The worker's Prometheus metrics (documented in the README).
#include "common/metrics.h"
#include "worker/engine/engine.h"

namespace tailserve {

struct WorkerMetrics {
  WorkerMetrics(Registry& r, double window_seconds);
  Histogram& step_time;
  WindowQuantiles& step_time_window;
  Gauge& running_sequences;
  Gauge& free_slots;
  Gauge& total_slots;
  Gauge& ready;
  Histogram& step_batch_size;
  Counter& prefill_tokens;
  Histogram& step_prefill_tokens;
  Gauge& waiting_sequences;
  Histogram& queue_wait;  // accepted → holding a slot
  Counter& preemptions;
  Counter& prefix_queried_tokens;  // tokens of admitted sequences looked up in the prefix cache
  Counter& prefix_hit_tokens;      // ... and found there (not computed)
  Gauge& kv_blocks_cached;
  Counter& kv_evictions;
  Counter& generated_tokens;
  Registry::Family<Counter>& batches;    // outcome
  Registry::Family<Counter>& sequences;  // reason
  // The learned step cost (StepCostModel's fit), by term: base, per_sequence, per_kv_token,
  // per_prefill_token; the sim's cost model takes these constants.
  Registry::Family<Gauge>& step_cost;
  // Backends with device state (cuda) report these; zero otherwise.
  Registry::Family<Gauge>& kv_blocks;  // state: used, free
  Counter& kv_clamps;
  Counter& graph_replays;
  // Sets the gauges and advances the counters to the engine's cumulative values.
  void Publish(const EngineStats& stats);
};

}  // namespace tailserve
