#!/usr/bin/env bash
# Prefix caching and cache-aware placement on real multi-turn traffic: the Mooncake conversation
# trace (each row's hash_ids name its 512-token prompt blocks; equal ids give equal tokens through
# tailserve-load) replayed against a router + WORKERS sim workers (4; a paged KV cache of
# KV_BLOCKS 16-token blocks, an 8B FP8 cache on an 80 GB card; the sim charges prefill only for
# the tokens it computes) at each of SPEEDS times the trace's rate, once per arm, all in the
# default slo mode with the length rule (no model: the trace has no text):
#   nocache  worker.prefix_caching=false: every prompt computed whole
#   cache    prefix caching on, placement by predicted TTFT from load alone
#   aware    prefix caching on and cache-aware placement (router.cache_aware_routing)
# Prints, per run: the hit rate (cached prompt tokens over all, from the workers' metrics) beside
# the oracle's (one infinite cache seeing every request in order), the busiest worker's requests
# over the mean, and bench/ladb_table.py's latency table.
#   bench/prefix_traces.sh [FROM_S=1200] [WINDOW_S=150] [SPEEDS="1 2"] [OUT=bench/out/prefix]
# ROUTER_FLAGS: more router flags for every arm (e.g. "--set router.max_load_imbalance=1.5").
set -euo pipefail
cd "$(dirname "$0")/.."
FROM_S=${FROM_S:-1200}
WINDOW_S=${WINDOW_S:-150}
SPEEDS=${SPEEDS:-"1 2"}
ARMS=${ARMS:-"nocache cache aware"}
WORKERS=${WORKERS:-4}
KV_BLOCKS=${KV_BLOCKS:-53000}
MAX_PROMPT=${MAX_PROMPT:-16384}
OUT=${OUT:-bench/out/prefix}
TRACE=../shared/traces/conversation_trace.jsonl
B=build/bin
mkdir -p "$OUT"

arm_flags() {  # $1: arm → worker flags, router flags
  case "$1" in
    nocache) echo "--set worker.prefix_caching=false|--set router.cache_aware_routing=false" ;;
    cache) echo "--set worker.prefix_caching=true|--set router.cache_aware_routing=false" ;;
    aware) echo "--set worker.prefix_caching=true|--set router.cache_aware_routing=true" ;;
  esac
}

# shellcheck source=bench/sim_cluster.sh
source bench/sim_cluster.sh
trap stop_sim_cluster EXIT

start_cluster() {  # $1: arm
  local flags
  flags=$(arm_flags "$1")
  start_sim_cluster "$OUT/run" "$WORKERS" "--set worker.sim.kv_blocks=$KV_BLOCKS ${flags%%|*}" \
    "--set predictor.model_path= --set router.max_prompt_tokens=$MAX_PROMPT ${flags#*|} ${ROUTER_FLAGS:-}"
}

for speed in $SPEEDS; do
  for arm in $ARMS; do
    start_cluster "$arm"
    run="conv_${speed}x_$arm"
    echo "== mooncake ${speed}x $arm (trace window ${FROM_S}s + ${WINDOW_S}s)" >&2
    "$B/tailserve-load" --target "127.0.0.1:$router_grpc" --trace "$TRACE" --from-s "$FROM_S" \
      --duration-s "$WINDOW_S" --speed "$speed" --sim-eos --max-prompt-tokens "$MAX_PROMPT" \
      --json "$OUT/$run.json" >&2 || true
    curl -s "localhost:$router_http/metrics" > "$OUT/$run.metrics"
    for i in $(seq "$WORKERS"); do
      echo "# worker $i"; curl -s "localhost:$(sed -n 's/http_port=//p' "$OUT/run/w$i")/metrics"
    done > "$OUT/$run.wmetrics"
    stop_sim_cluster
  done
done
python3 bench/prefix_table.py "$OUT" "$TRACE" "$FROM_S" "$WINDOW_S" "$MAX_PROMPT"
python3 bench/ladb_table.py "$OUT"
