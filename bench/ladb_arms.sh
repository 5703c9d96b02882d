# The scheduling arms bench/ladb_traces.sh (sim workers) and bench/gpu_serve.sh (a CUDA worker)
# run, as worker and router flags. Sourced; the caller sets BUDGET (step-token budget), TARGET_MS
# (step-time target) and REJECT_WAITING (slo early rejection depth). Arms:
#   fcfs        the stock vLLM-like cluster: each request at once to the least-loaded worker, no
#               prediction; workers queue (max_waiting 256), admit first come first served, run
#               BUDGET-token steps (chunked prefill), grow KV on demand, preempt the newest
#   fcfs-target fcfs with a step-time target (TARGET_MS): steps prefill as much as the learned
#               step cost fits in it, BUDGET a floor; no prediction
#   slo         the same worker mechanics and target driven by the prediction: placement by
#               predicted TTFT, admission by predicted remaining work with a 2 s aging bound, KV
#               reserved for the prediction + 20%, preemption of the most predicted work left
#               and early rejection past REJECT_WAITING waiting sequences
#   slo-budget  slo without the step-time target (BUDGET-token steps, as fcfs): what the
#               prediction alone adds
#   fcfs-noqueue fcfs with the workers before the queue: whole prompts before the next decode
#               step, KV reserved for max_tokens
#   ladb        length-aware batches at the router, with the same workers as fcfs-noqueue
# shellcheck shell=bash

arm_flags() {  # $1: arm → the worker flags it runs with
  local queued="--set worker.max_waiting=256 --set worker.step_token_budget=$BUDGET"
  local stock="$queued --set worker.admission=fcfs --set worker.kv_reservation=on_demand --set worker.preemption=newest"
  local predicted="$queued --set worker.admission=predicted --set worker.kv_reservation=predicted"
  predicted+=" --set worker.preemption=most_remaining"
  local target="--set worker.step_time_target_ms=$TARGET_MS" untargeted="--set worker.step_time_target_ms=0"
  # The workers before the queue: every prompt whole before the next decode step, KV for max_tokens.
  local whole="--set worker.max_waiting=0 --set worker.step_token_budget=0 $untargeted --set worker.admission=fcfs"
  whole+=" --set worker.kv_reservation=max_tokens --set worker.preemption=newest"
  case "$1" in
    fcfs) echo "$stock $untargeted" ;;
    fcfs-target) echo "$stock $target" ;;
    slo) echo "$predicted $target" ;;
    slo-budget) echo "$predicted $untargeted" ;;
    *) echo "$whole" ;;
  esac
}

arm_router_flags() {  # $1: arm → the router flags it runs with
  case "$1" in
    slo | slo-budget) echo "--set router.slo_reject_waiting=$REJECT_WAITING" ;;
    *) echo "--set router.slo_reject_waiting=0" ;;
  esac
}

arm_mode() {  # $1: arm → the router's batching.mode
  case "$1" in fcfs-noqueue | fcfs-target) echo fcfs ;; slo-budget) echo slo ;; *) echo "$1" ;; esac
}
