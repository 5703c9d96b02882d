#!/usr/bin/env bash
# The router under overload and hostile clients, on the sim cluster (bench/sim_cluster.sh):
#   idle     10,000 TCP connections to the router's gRPC port that never speak, held 20 s, while
#            50 normal requests run: do they finish, and what do the connections cost and for how long
#   overload the conversation trace window at SPEEDS (one worker: FCFS's goodput rate is 2.5x, so
#            2.5 / 5 / 10 are 1x, 2x and 4x it): goodput, statuses, the router's peak and final RSS
#   unread   50 streamed HTTP completions whose clients never read (a fast sim, so they would
#            outgrow any buffer), beside 200 normal requests: are they cancelled, do the others slow
# Prints one table a phase. OUT (bench/out/overload), SPEEDS ("2.5 5 10").
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-build/bin}
OUT=${OUT:-bench/out/overload}
SPEEDS=${SPEEDS:-2.5 5 10}
PHASES=${PHASES:-idle overload unread}
mkdir -p "$OUT"
# shellcheck source=bench/sim_cluster.sh
source bench/sim_cluster.sh
ulimit -n "$(ulimit -Hn)"
peak_rss() {  # pid seconds: the largest RSS sampled every 0.2 s
  local p=$1 n=$(( $2 * 5 )) m=0 r
  for _ in $(seq "$n"); do r=$(rss_kb "$p"); [ "$r" -gt "$m" ] && m=$r; sleep 0.2; done
  echo "$m"
}

phase() { [[ " $PHASES " == *" $1 "* ]]; }
if phase idle; then
echo "## idle connections"
start_sim_cluster "$OUT/idle" 1 "" ""
rp=$router_pid
before="$(rss_kb "$rp") kB, $(open_fds "$rp") fds"
python3 bench/hostile_clients.py idle "$router_grpc" 10000 20 > "$OUT/idle.log" 2>&1 &
hp=$!
sleep 5
held="$(rss_kb "$rp") kB, $(open_fds "$rp") fds"
"$B/tailserve-load" --target "127.0.0.1:$router_grpc" --requests 50 --rate 10 --prompt-tokens 256 --max-tokens 64 \
  --timeout-s 30 > "$OUT/idle_load.txt" 2>&1
wait "$hp"
sleep 12  # the heap trimmer runs every 10 s
after="$(rss_kb "$rp") kB, $(open_fds "$rp") fds"
echo "| router before | with 10,000 idle connections (5 s in) | after they were closed | normal requests meanwhile | |"
echo "|---|---|---|---|---|"
echo "| $before | $held | $after | $(grep -Eo 'ok [0-9]+' "$OUT/idle_load.txt" | head -1) of 50, TTFT P99 $(awk '/^ttft/ {print $4}' "$OUT/idle_load.txt") ms | $(tail -1 "$OUT/idle.log") |"
stop_sim_cluster
fi

if phase overload; then
echo
echo "## overload (one worker, conversation trace from 2631 s, 60 s window)"
echo "| speed | sent | ok | refused early (RESOURCE_EXHAUSTED) | other failures | goodput req/s | TTFT P99 ms (served) | router RSS peak / after kB |"
echo "|---:|---:|---:|---:|---:|---:|---:|---|"
for s in $SPEEDS; do
  start_sim_cluster "$OUT/o$s" 1 "" ""
  rp=$router_pid
  dur=$(awk "BEGIN{printf \"%d\", 60 / $s + 15}")
  peak_rss "$rp" "$dur" > "$OUT/o$s.peak" &
  pk=$!
  "$B/tailserve-load" --target "127.0.0.1:$router_grpc" --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv \
    --from-s 2631 --duration-s 60 --speed "$s" --sim-eos --max-prompt-tokens 16384 --timeout-s 60 \
    --json "$OUT/o$s.json" > "$OUT/o$s.txt" 2>&1
  wait "$pk"
  python3 - "$OUT/o$s.json" "$s" "$(cat "$OUT/o$s.peak")" "$(rss_kb "$rp")" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
codes = j.get("status", {})
sent = sum(codes.values())
ok = codes.get("OK", 0)
refused = codes.get("RESOURCE_EXHAUSTED", 0)
print(f"| {sys.argv[2]}x | {sent} | {ok} | {refused} | {sent - ok - refused} | {j.get('goodput_rps', float('nan')):.2f} | "
      f"{1000 * (j['ttft_s']['p99'] or float('nan')):.0f} | {sys.argv[3]} / {sys.argv[4]} |")
PY
  stop_sim_cluster
done
fi

if phase unread; then
echo
echo "## clients that never read (HTTP API, fast sim)"
start_sim_cluster "$OUT/unread" 1 "--set worker.sim.step_base_ms=0.2" \
  "--set router.api_port=0 --set router.max_tokens_limit=1000000"
rp=$router_pid
api=$(sed -n 's/api_port=//p' "$OUT/unread/r")
"$B/tailserve-load" --target "127.0.0.1:$router_grpc" --requests 200 --rate 20 --prompt-tokens 256 --max-tokens 64 \
  --timeout-s 60 > "$OUT/unread_alone.txt" 2>&1
before=$(rss_kb "$rp")
python3 bench/hostile_clients.py unread "$api" 50 1000000 > "$OUT/unread.log" 2>&1 &
hp=$!
sleep 3
peak_rss "$rp" 20 > "$OUT/unread.peak" &
pk=$!
"$B/tailserve-load" --target "127.0.0.1:$router_grpc" --requests 200 --rate 20 --prompt-tokens 256 --max-tokens 64 \
  --timeout-s 60 > "$OUT/unread_beside.txt" 2>&1
wait "$pk"; wait "$hp"
sleep 12
echo "| router RSS before / peak / after kB | unread streams the router cancelled (its log) | normal TTFT P99 alone / beside them ms | normal ok beside them |"
echo "|---|---|---|---|"
echo "| $before / $(cat "$OUT/unread.peak") / $(rss_kb "$rp") | $(grep -c 'does not read its stream' "$OUT/unread/r.log") of 50 | $(awk '/^ttft/ {print $4}' "$OUT/unread_alone.txt") / $(awk '/^ttft/ {print $4}' "$OUT/unread_beside.txt") | $(grep -Eo 'ok [0-9]+' "$OUT/unread_beside.txt" | head -1) of 200 |"
stop_sim_cluster
fi
