#include "router/router_metrics.h"

namespace tailserve {

RouterMetrics::RouterMetrics(Registry& r, double w)
    : requests(r.AddCounter("tailserve_router_requests_total",
                            "Requests by outcome: stop, length, cancelled, deadline_exceeded, invalid_argument, "
                            "resource_exhausted, unavailable, error.",
                            {"outcome"})),
      queue_time(r.AddHistogram("tailserve_router_queue_time_seconds",
                                "Arrival to first dispatch to a worker, per request.", LatencyBuckets())
                     .Get()),
      ttft(r.AddHistogram("tailserve_router_ttft_seconds", "Arrival to first token sent, per request.", LatencyBuckets())
               .Get()),
      tpot(r.AddHistogram("tailserve_router_tpot_seconds",
                          "Time per output token after the first: (total - ttft) / (tokens - 1), per request.",
                          StepTimeBuckets())
               .Get()),
      e2e(r.AddHistogram("tailserve_router_e2e_latency_seconds", "Arrival to last response, per request.",
                         LatencyBuckets())
              .Get()),
      queue_time_window(r.AddWindowQuantiles("tailserve_router_queue_time_window_seconds",
                                             "Queue time P50/P95/P99 over the sliding metrics window.", w)
                            .Get()),
      ttft_window(
          r.AddWindowQuantiles("tailserve_router_ttft_window_seconds", "TTFT P50/P95/P99 over the sliding window.", w)
              .Get()),
      tpot_window(r.AddWindowQuantiles("tailserve_router_tpot_window_seconds",
                                       "Time per output token P50/P95/P99 over the sliding window.", w)
                      .Get()),
      e2e_window(r.AddWindowQuantiles("tailserve_router_e2e_latency_window_seconds",
                                      "End-to-end latency P50/P95/P99 over the sliding window.", w)
                     .Get()),
      queue_length(r.AddGauge("tailserve_router_queue_length",
                              "Requests waiting for a batch (the autoscaling signal).")
                       .Get()),
      inflight(r.AddGauge("tailserve_router_inflight_requests", "Requests accepted and not yet finished.").Get()),
      batch_size(r.AddHistogram("tailserve_router_batch_size", "Sequences per dispatched batch.",
                                {1, 2, 4, 8, 16, 32, 64, 128, 256})
                     .Get()),
      batch_efficiency(r.AddHistogram("tailserve_router_batch_efficiency_ratio",
                                      "Dispatched batch size / batching.max_batch_size.",
                                      LinearBuckets(0.1, 0.1, 10))
                           .Get()),
      batches(r.AddCounter("tailserve_router_batches_total",
                           "Batches dispatched, by why they left the queue: full, min_size, timeout.", {"reason"})),
      redispatches(r.AddCounter("tailserve_router_redispatches_total",
                                "Sequences dispatched again: budget (step budget spent), worker_failure, rejected.",
                                {"reason"})),
      output_tokens(r.AddCounter("tailserve_router_output_tokens_total", "Tokens streamed to clients.").Get()),
      workers_healthy(r.AddGauge("tailserve_router_workers_healthy", "Workers in rotation.").Get()),
      predictions(r.AddCounter("tailserve_router_predictions_total",
                               "Step predictions by source: model (ONNX, calibrated) or rule.", {"source"})),
      predictor_abs_error(r.AddHistogram("tailserve_router_predictor_abs_error_steps",
                                         "|predicted - actual| decode steps of finished requests.",
                                         {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096})
                              .Get()),
      ttft_prediction_abs_error(
          r.AddHistogram("tailserve_router_ttft_prediction_abs_error_seconds",
                         "|predicted - actual| seconds from dispatch to the first token (batching.mode slo placement).",
                         LatencyBuckets())
              .Get()),
      slo_requests(r.AddCounter("tailserve_router_slo_requests_total",
                                "Finished requests with a TTFT or TPOT objective, by priority class.", {"class"})),
      slo_attained(r.AddCounter("tailserve_router_slo_attained_total",
                                "Finished requests that met their objective: ttft, tpot, or both (every objective "
                                "they had: goodput), by priority class.",
                                {"class", "slo"})),
      slo_rejections(r.AddCounter("tailserve_router_slo_rejections_total",
                                  "Requests refused at arrival (RESOURCE_EXHAUSTED) because no worker could meet their "
                                  "TTFT objective with queues past router.slo_reject_waiting, by priority class.",
                                  {"class"})),
      predictor_window_mape(r.AddGauge("tailserve_router_predictor_window_mape",
                                       "Mean absolute percentage error of the model over the drift window (0.3 = 30%).")
                                .Get()),
      drift_active(r.AddGauge("tailserve_router_predictor_drift_active",
                              "1 while drift is detected (FIFO batching, rule predictions).")
                       .Get()),
      drift_events(r.AddCounter("tailserve_router_predictor_drift_events_total", "Times drift was detected.").Get()),
      session_affinity_placements(r.AddCounter("tailserve_router_session_affinity_placements_total",
                                               "Requests placed on their session's last worker rather than the "
                                               "one of least predicted TTFT (router.session_affinity).")
                                      .Get()),
      prefix_event_workers(r.AddGauge("tailserve_router_prefix_cache_event_workers",
                                      "Workers whose prefix cache the router follows by their events "
                                      "(router.prefix_cache_events); the others by its own placements.")
                               .Get()),
      batch_prediction_cv(r.AddHistogram("tailserve_router_batch_prediction_cv_ratio",
                                         "Coefficient of variation (std / mean) of predicted steps within a batch.",
                                         {0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2})
                              .Get()),
      worker_up(r.AddGauge("tailserve_router_worker_up", "1 when the worker is in rotation, else 0.", {"worker"})),
      api_key_requests(r.AddCounter("tailserve_router_api_key_requests_total",
                                    "Client requests by API key name (\"\" when missing or unknown) and outcome: admitted, "
                                    "unauthenticated, rate_limited.",
                                    {"key", "outcome"})) {}

}  // namespace tailserve
