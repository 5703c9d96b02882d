#pragma once
// The worker's Prometheus metrics (documented in the README).
#include "common/metrics.h"

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
  Counter& generated_tokens;
  Registry::Family<Counter>& batches;    // outcome
  Registry::Family<Counter>& sequences;  // reason
};

}  // namespace tailserve
