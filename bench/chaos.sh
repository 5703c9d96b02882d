#!/usr/bin/env bash
# Chaos on real traffic: a window of the Azure conversation trace replayed against a router and
# WORKERS sim workers (each behind a TCP proxy of ours, bench/chaos_proxy.py), once fault-free and
# once while a seeded fault injector breaks things. Faults, one every FAULT_EVERY_S (seeded order):
#   kill     SIGKILL a worker, restart it on its port 2 s later
#   stop     SIGSTOP a worker for 4 s (a hung process: its sockets stay open), then SIGCONT
#   drop     reset every connection through a worker's proxy
#   delay    delay everything through a worker's proxy by 200 ms a chunk for 3 s
#   router   SIGKILL the router, restart it on its ports at once
#   kvfill   a burst of 24 long-prompt, long-output requests (the workers' KV caches are cut to
#            KV_BLOCKS blocks, so the burst fills them and forces preemption)
# Then bench/chaos_check.py checks every request against the fault-free run (same seeds): it
# completed with exactly the same tokens, or failed with a documented status within its
# deadline; nothing hung, nothing lost; and the processes' memory after against before.
#   bash bench/chaos.sh        (SEED, WINDOW_S 60, SPEED 2, WORKERS 3, FAULT_EVERY_S 3, FAULTS "kill stop drop delay router kvfill")
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-build/bin}
SEED=${SEED:-7}
WINDOW_S=${WINDOW_S:-60}
SPEED=${SPEED:-2}
WORKERS=${WORKERS:-3}
FAULT_EVERY_S=${FAULT_EVERY_S:-3}
FAULTS=(${FAULTS:-kill stop drop delay router kvfill})
KV_BLOCKS=${KV_BLOCKS:-6000}
TIMEOUT_S=${TIMEOUT_S:-60}
TRACE=${TRACE:-../shared/traces/AzureLLMInferenceTrace_conv.csv}
OUT=${OUT:-bench/out/chaos}
rm -rf "$OUT"; mkdir -p "$OUT"
pids_w=(); pids_p=(); wport=(); pport=(); pid_r=""; rgrpc=""; rhttp=""

start_worker() {  # i [port]
  local i=$1 port=${2:-0}
  "$B/tailserve-worker" --config ladb_config.yaml --grpc-port "$port" --http-port 0 --listen-host 127.0.0.1 \
    --log-level warn --ports-file "$OUT/w$i" --set "worker.sim.kv_blocks=$KV_BLOCKS" >> "$OUT/w$i.log" 2>&1 &
  pids_w[$i]=$!
}
start_router() {  # [grpc port] [http port]
  local workers="" i
  for i in $(seq "$WORKERS"); do workers+="${workers:+,}127.0.0.1:${pport[$i]}"; done
  "$B/tailserve-router" --config ladb_config.yaml --grpc-port "${1:-0}" --http-port "${2:-0}" --listen-host 127.0.0.1 \
    --log-level warn --workers "$workers" --ports-file "$OUT/r" >> "$OUT/r.log" 2>&1 &
  pid_r=$!
}
wait_file() { for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.05; done; return 1; }
# shellcheck source=bench/sim_cluster.sh
source bench/sim_cluster.sh  # rss_kb, open_fds (its cluster is not used: the workers sit behind proxies)

for i in $(seq "$WORKERS"); do
  start_worker "$i"; wait_file "$OUT/w$i"
  wport[$i]=$(sed -n 's/grpc_port=//p' "$OUT/w$i")
  python3 bench/chaos_proxy.py 0 "${wport[$i]}" "$OUT/p$i" > "$OUT/p$i.log" 2>&1 &
  pids_p[$i]=$!; wait_file "$OUT/p$i"; pport[$i]=$(cat "$OUT/p$i")
done
rm -f "$OUT/r"; start_router; wait_file "$OUT/r"
rgrpc=$(sed -n 's/grpc_port=//p' "$OUT/r"); rhttp=$(sed -n 's/http_port=//p' "$OUT/r")
for _ in $(seq 100); do curl -sf "localhost:$rhttp/readyz" > /dev/null && break; sleep 0.1; done

load() {  # out-file
  "$B/tailserve-load" --target "127.0.0.1:$rgrpc" --trace "$TRACE" --from-s 2631 --duration-s "$WINDOW_S" \
    --speed "$SPEED" --sim-eos --max-prompt-tokens 16384 --timeout-s "$TIMEOUT_S" --seed "$SEED" \
    --tokens-out "$1" > "$1.table" 2>&1
}
memory() {  # label: RSS and descriptors of every process
  local i line="$1 router $(rss_kb "$pid_r") kB $(open_fds "$pid_r") fds"
  for i in $(seq "$WORKERS"); do line+=" | w$i $(rss_kb "${pids_w[$i]}") kB $(open_fds "${pids_w[$i]}") fds"; done
  echo "$line" >> "$OUT/memory.log"
}

echo "== fault-free run" >&2
load "$OUT/base.jsonl"
sleep 2; memory before

echo "== the same with faults (seed $SEED)" >&2
RANDOM=$SEED
kv_pids=()
start_s=$(date +%s.%N)
load "$OUT/chaos.jsonl" &
load_pid=$!
fault_end=$(awk "BEGIN{printf \"%.3f\", $start_s + $WINDOW_S / $SPEED}")
while kill -0 "$load_pid" 2>/dev/null && awk "BEGIN{exit !($(date +%s.%N) < $fault_end)}"; do
  sleep "$FAULT_EVERY_S"
  kind=${FAULTS[$((RANDOM % ${#FAULTS[@]}))]}
  w=$((RANDOM % WORKERS + 1))
  at=$(awk "BEGIN{printf \"%.3f\", $(date +%s.%N) - $start_s}")  # when it starts
  case $kind in
    kill) kill -9 "${pids_w[$w]}"; wait "${pids_w[$w]}" 2>/dev/null; dur=2; sleep 2; start_worker "$w" "${wport[$w]}" ;;
    stop) kill -STOP "${pids_w[$w]}"; dur=4; sleep 4; kill -CONT "${pids_w[$w]}" ;;
    drop) kill -USR1 "${pids_p[$w]}"; dur=0 ;;
    delay) kill -USR2 "${pids_p[$w]}"; dur=3 ;;
    router) kill -9 "$pid_r"; wait "$pid_r" 2>/dev/null; w=0; dur=0; start_router "$rgrpc" "$rhttp" ;;
    kvfill) "$B/tailserve-load" --target "127.0.0.1:$rgrpc" --requests 24 --rate 0 --prompt-tokens 6000 \
              --max-tokens 3000 --timeout-s 30 --seed $RANDOM > /dev/null 2>&1 & kv_pids+=($!); w=0; dur=0 ;;
  esac
  echo "$at $kind $w $dur" >> "$OUT/faults.log"
done
wait "$load_pid"
for p in "${kv_pids[@]}"; do wait "$p"; done
sleep 10; memory after
kill "${pids_w[@]}" "${pids_p[@]}" "$pid_r" 2>/dev/null; wait 2>/dev/null
python3 bench/chaos_check.py "$OUT" "$TIMEOUT_S"
