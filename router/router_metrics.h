#pragma once
// The router's Prometheus metrics (documented in the README). Per request, not per batch.
#include "common/metrics.h"

namespace tailserve {

struct RouterMetrics {
  RouterMetrics(Registry& r, double window_seconds);
  Registry::Family<Counter>& requests;  // outcome
  Histogram& queue_time;
  Histogram& ttft;
  Histogram& tpot;
  Histogram& e2e;
  WindowQuantiles& queue_time_window;
  WindowQuantiles& ttft_window;
  WindowQuantiles& tpot_window;
  WindowQuantiles& e2e_window;
  Gauge& queue_length;
  Gauge& inflight;
  Histogram& batch_size;
  Histogram& batch_efficiency;
  Registry::Family<Counter>& batches;       // reason
  Registry::Family<Counter>& redispatches;  // reason
  Counter& output_tokens;
  Gauge& workers_healthy;
  Registry::Family<Counter>& predictions;  // source
  Histogram& predictor_abs_error;
  Histogram& ttft_prediction_abs_error;
  Registry::Family<Counter>& slo_requests;  // class
  Registry::Family<Counter>& slo_attained;  // class, slo (ttft, tpot, both)
  Registry::Family<Counter>& slo_rejections;  // class
  Gauge& predictor_window_mape;
  Gauge& drift_active;
  Counter& drift_events;
  Counter& session_affinity_placements;
  Gauge& prefix_event_workers;
  Histogram& batch_prediction_cv;
  Registry::Family<Gauge>& worker_up;  // worker
  Registry::Family<Counter>& api_key_requests;  // key (its name; "" for none or unknown), outcome
};

}  // namespace tailserve
