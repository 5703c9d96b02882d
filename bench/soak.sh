#!/usr/bin/env bash
# A long run of the sim cluster (bench/sim_cluster.sh: a router and WORKERS workers) under the
# conversation trace replayed window after window, with a worker SIGSTOPped for 3 s every
# FAULT_EVERY_S: every SAMPLE_S it records the router's and each worker's RSS and open descriptors,
# and the workers' median step time (tailserve_worker_step_time_window_seconds). A leak shows as
# growth over the samples, a slowdown as drift in the step time. Prints the samples as a table,
# then the requests' statuses over the whole run.
#   bash bench/soak.sh     (DURATION_S 1800, WORKERS 2, SPEED 3, SAMPLE_S 120, FAULT_EVERY_S 60)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-build/bin}
OUT=${OUT:-bench/out/soak}
DURATION_S=${DURATION_S:-1800}
WORKERS=${WORKERS:-2}
SPEED=${SPEED:-3}
SAMPLE_S=${SAMPLE_S:-120}
FAULT_EVERY_S=${FAULT_EVERY_S:-60}
rm -rf "$OUT"; mkdir -p "$OUT"  # the status count reads every load_*.json here
# shellcheck source=bench/sim_cluster.sh
source bench/sim_cluster.sh
start_sim_cluster "$OUT/run" "$WORKERS" "" ""
rp=$router_pid
wp=("${worker_pids[@]}"); wh=()
for i in $(seq "$WORKERS"); do wh+=("$(sed -n 's/http_port=//p' "$OUT/run/w$i")"); done
end=$((SECONDS + DURATION_S))
( n=0; while [ $SECONDS -lt $end ]; do  # the load: the trace window, again and again
    "$B/tailserve-load" --target "127.0.0.1:$router_grpc" --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv \
      --from-s $((2631 + 150 * (n % 4))) --duration-s 150 --speed "$SPEED" --sim-eos --max-prompt-tokens 16384 \
      --timeout-s 60 --seed $n --json "$OUT/load_$n.json" > /dev/null 2>&1
    n=$((n + 1))
  done ) &
lp=$!
( while [ $SECONDS -lt $end ]; do sleep "$FAULT_EVERY_S"; w=${wp[$((RANDOM % WORKERS))]}; kill -STOP "$w"; sleep 3; kill -CONT "$w"; done ) &
fp=$!
echo "| minute | router RSS kB | router fds | workers RSS kB | workers fds | workers' median step ms |"
echo "|---:|---:|---:|---|---|---|"
start=$SECONDS
while :; do
  wr=""; wf=""; st=""
  for i in "${!wp[@]}"; do
    wr+="${wr:+ / }$(rss_kb "${wp[$i]}")"; wf+="${wf:+ / }$(open_fds "${wp[$i]}")"
    m=$(curl -s "localhost:${wh[$i]}/metrics" | awk '/^tailserve_worker_step_time_window_seconds\{quantile="0.5"\}/ {printf "%.2f", $2 * 1000}')
    st+="${st:+ / }${m:-?}"
  done
  echo "| $(( (SECONDS - start) / 60 )) | $(rss_kb "$rp") | $(open_fds "$rp") | $wr | $wf | $st |"
  [ $SECONDS -ge $end ] && break
  sleep "$SAMPLE_S"
done
wait "$lp" 2>/dev/null; kill "$fp" 2>/dev/null; wait "$fp" 2>/dev/null
sleep 12
echo "| end (+12 s idle) | $(rss_kb "$rp") | $(open_fds "$rp") | $(for p in "${wp[@]}"; do printf '%s ' "$(rss_kb "$p")"; done) | | |"
python3 - "$OUT" <<'PY'
import glob, json, sys
codes, n = {}, 0
for f in glob.glob(sys.argv[1] + "/load_*.json"):
    j = json.load(open(f))
    for k, v in j["status"].items():
        codes[k] = codes.get(k, 0) + v
    n += 1
print(f"\n{n} trace windows, requests by status: {codes}")
PY
stop_sim_cluster
