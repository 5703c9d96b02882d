#!/usr/bin/env bash
# Scheduling on the GPU: one CUDA worker serving the 8B shape (synthetic weights, FP8 KV, the
# config's 64 slots) behind the router; a window of the conversation trace's held-out tail
# (SERVE_FROM_S 2631 s, SERVE_WINDOW_S 150 s: 888 requests) replayed at each of SERVE_SPEEDS times
# its rate, once per arm in SERVE_ARMS (bench/ladb_arms.sh). Random weights never emit EOS, and a
# max_tokens of the trace's length would hand that length to the router, so each request asks for
# up to 4096 tokens and the client hangs up at the trace's output length (tailserve-load
# --client-stop). Each run's summary (JSON), router and worker metrics land in $OUT/serve, with the
# step cost the worker learned (tailserve_worker_step_cost_seconds, sampled every 10 s): the
# constants the sim's mixed-step cost model takes. Prints bench/ladb_table.py's table. The router
# has no checkpoint, so its byte tokenizer takes ids below 256 (SERVE_VOCAB): the load stays in it.
#
# On the device: bash bench/gpu_run.sh serve (after bench/gpu_pack.sh with SERVE=1, from the tree that
# is sent: the programs read its ladb_config.yaml, and a key they do not know stops them). Without a GPU,
# SERVE_BACKEND=sim SERVE_BIN_DIR=build/bin SERVE_DATA=... tries the script on sim workers.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
D=$OUT/serve
mkdir -p "$D"
SPEEDS=${SERVE_SPEEDS:-"3 4"}
ARMS=${SERVE_ARMS:-"fcfs slo"}
FROM_S=${SERVE_FROM_S:-2631}
WINDOW_S=${SERVE_WINDOW_S:-150}
BACKEND=${SERVE_BACKEND:-cuda}
CKPT=${SERVE_CKPT:-/tmp/ckpt/l8b}
DATA=${SERVE_DATA:-.gpu/serve}  # model_conv.onnx (the predictor trained on the first 80%), conv.csv
BUDGET=${BUDGET:-512}
TARGET_MS=${TARGET_MS:-25}
REJECT_WAITING=${REJECT_WAITING:-8}
# shellcheck source=bench/ladb_arms.sh
source bench/ladb_arms.sh

B=${SERVE_BIN_DIR:-.gpu/bin}
# shellcheck source=bench/gpu_serve_lib.sh
source bench/gpu_serve_lib.sh
trap stop EXIT

for speed in $SPEEDS; do
  for arm in $ARMS; do
    run="conv_${speed}x_$arm"
    r=$D/run; rm -rf "$r"; mkdir -p "$r"
    t0=$SECONDS
    # shellcheck disable=SC2046  # arm flags: words
    start_worker "$r" "$D/$run.wlog" --set worker.backend="$BACKEND" --set worker.model_path="$CKPT" \
      $(arm_flags "$arm") || continue
    # shellcheck disable=SC2046  # arm flags: words
    start_router "$r" "$D/$run.rlog" "127.0.0.1:$w_grpc" --set batching.mode="$(arm_mode "$arm")" \
      --set predictor.model_path="$(realpath "$DATA/model_conv.onnx")" --set predictor.warmup_steps=0 \
      --set router.max_prompt_tokens=16384 $(arm_router_flags "$arm") || continue
    echo "== $run: serving after $((SECONDS - t0)) s"
    ( while sleep 10; do
        echo "t=$((SECONDS - t0))"; curl -s "localhost:$w_http/metrics" | grep -E '^tailserve_worker_step_cost_seconds'
      done ) > "$D/$run.stepcost" 2>&1 &
    sampler=$!
    timeout 400 .gpu/run "$B/tailserve-load" --target "127.0.0.1:$r_grpc" --trace "$DATA/conv.csv" \
      --from-s "$FROM_S" --duration-s "$WINDOW_S" --speed "$speed" --client-stop --max-prompt-tokens 16384 \
      --vocab "${SERVE_VOCAB:-256}" --timeout-s 120 --json "$D/$run.json" > "$D/$run.load" 2>&1
    kill "$sampler" 2>/dev/null
    curl -s "localhost:$r_http/metrics" > "$D/$run.metrics"
    curl -s "localhost:$w_http/metrics" > "$D/$run.wmetrics"
    grep -E '^tailserve_worker_step_cost_seconds|^tailserve_worker_preemptions_total' "$D/$run.wmetrics"
    stop
    echo "$run: done after $((SECONDS - t0)) s"
  done
done
python3 bench/ladb_table.py "$D" | tee "$D/table.md"
