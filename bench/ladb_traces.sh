#!/usr/bin/env bash
# The schedulers against the honest FCFS baseline on the real traces: for each trace, train the
# length predictor on its first 80% (time order), then replay a window of the held-out last 20%
# against a router + WORKERS sim workers (4; the cost model issue 3 gives) at each of SPEEDS times
# the trace's own arrival rate, once per arm in MODES. Prints the table (bench/ladb_table.py) and
# keeps every run's JSON summary and router metrics under OUT. The arms, each a router mode and
# the worker mechanics it runs with, are bench/ladb_arms.sh's.
#
#   bench/ladb_traces.sh [WINDOW_S=300] [FROM_S=start of the held-out 20%] [OUT=bench/out/ladb]
#   (build first: scripts/build.sh)
#
# Requests end by a simulated EOS at the trace's output length with max_tokens capped at 4096
# (tailserve-load --sim-eos), so the router never learns a length from max_tokens. The sim
# workers account a paged KV cache the size an 8B model's FP8 cache has on an 80 GB card
# (KV_BLOCKS, 53,000 blocks of 16 tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
WINDOW_S=${WINDOW_S:-300}
OUT=${OUT:-bench/out/ladb}
SPEEDS=${SPEEDS:-"1 2 4"}
MODES=${MODES:-"fcfs slo"}
BUDGET=${BUDGET:-512}
TARGET_MS=${TARGET_MS:-25}
# slo arms: the router refuses at arrival what no worker can serve within its TTFT objective once
# the best worker's queue holds this many (0: never).
REJECT_WAITING=${REJECT_WAITING:-8}
KV_BLOCKS=${KV_BLOCKS:-53000}
# The sim's step cost, "a b c p": step = a ms + b ms a sequence + c ns a KV token + p ms a prefill
# token. Default: the cost model issue 3 gives (the recorded sim results use it), not the defaults
# fitted later; the GPU serving runs' online fit is "4.92 0 96 0.0368" (bench/RESULTS.md).
read -r SIM_A SIM_B SIM_C SIM_P <<< "${SIM_COST:-4.0 0.02 15 0.03}"
# WORKER_FLAGS go to every worker (e.g. --set worker.aging_ms=1000); TAG is appended to the arm in
# the output files, so such a run sits beside the defaults in one table.
WORKER_FLAGS=${WORKER_FLAGS:-}
TAG=${TAG:-}
WORKERS=${WORKERS:-4}
TRACES=${TRACES:-"conv code"}
B=build/bin
SHARED=../shared/traces
mkdir -p "$OUT"

# shellcheck source=bench/ladb_arms.sh
source bench/ladb_arms.sh

# shellcheck source=bench/sim_cluster.sh
source bench/sim_cluster.sh
trap stop_sim_cluster EXIT

start_cluster() {  # $1: arm, $2: model
  local sim="--set worker.sim.step_base_ms=$SIM_A --set worker.sim.step_per_sequence_ms=$SIM_B"
  sim+=" --set worker.sim.step_per_kv_token_ns=$SIM_C --set worker.sim.step_per_prefill_token_ms=$SIM_P"
  sim+=" --set worker.sim.kv_blocks=$KV_BLOCKS"
  start_sim_cluster "$OUT/run" "$WORKERS" "$sim $(arm_flags "$1") $WORKER_FLAGS" \
    "--set batching.mode=$(arm_mode "$1") --set predictor.model_path=$(realpath "$2") --set predictor.warmup_steps=0 \
     --set router.max_prompt_tokens=16384 $(arm_router_flags "$1")"
}

for trace in $TRACES; do
  file="$SHARED/AzureLLMInferenceTrace_$trace.csv"
  model="$OUT/model_$trace.onnx"
  "$B/tailserve-train" --trace "$file" --model mlp --holdout 0.2 --out "$model" > "$OUT/train_$trace.md"
  # Trace time (s) at which the held-out 20% of rows begins.
  from_s=$(python3 - "$file" <<'PY'
import csv, sys, datetime
rows = list(csv.reader(open(sys.argv[1])))[1:]
t = lambda r: datetime.datetime.strptime(r[0][:26], "%Y-%m-%d %H:%M:%S.%f")
print(f"{(t(rows[int(len(rows) * 0.8)]) - t(rows[0])).total_seconds():.3f}")
PY
)
  from_s=${FROM_S:-$from_s}
  for speed in $SPEEDS; do
    for mode in $MODES; do
      start_cluster "$mode" "$model"
      echo "== $trace ${speed}x $mode$TAG (trace window ${from_s}s + ${WINDOW_S}s)" >&2
      "$B/tailserve-load" --target "127.0.0.1:$router_grpc" --trace "$file" --from-s "$from_s" \
        --duration-s "$WINDOW_S" --speed "$speed" --sim-eos --max-prompt-tokens 16384 \
        --json "$OUT/${trace}_${speed}x_${mode}${TAG}.json" >&2 || true
      curl -s "localhost:$router_http/metrics" > "$OUT/${trace}_${speed}x_${mode}${TAG}.metrics"
      for i in $(seq "$WORKERS"); do
        curl -s "localhost:$(sed -n 's/http_port=//p' "$OUT/run/w$i")/metrics"
      done > "$OUT/${trace}_${speed}x_${mode}${TAG}.wmetrics"
      stop_sim_cluster
    done
  done
done
python3 bench/ladb_table.py "$OUT"
