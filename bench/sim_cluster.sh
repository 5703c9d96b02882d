# A local cluster for the sim benchmarks (bench/ladb_traces.sh, bench/prefix_traces.sh): N workers
# and a router on loopback ports chosen at start, all reading ladb_config.yaml. Sourced; uses $B
# (the programs' folder). After start_sim_cluster: $router_grpc, $router_http, $router_pid and
# $worker_pids (an array); the workers' ports files are DIR/w1..wN. rss_kb PID and open_fds PID read
# a process's resident memory and descriptors (the hardening benches sample them).
#   start_sim_cluster DIR N "WORKER FLAGS" "ROUTER FLAGS"
#   stop_sim_cluster
# shellcheck shell=bash

sim_cluster_pids=()

rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
open_fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }

stop_sim_cluster() {
  kill "${sim_cluster_pids[@]}" 2>/dev/null || true
  wait "${sim_cluster_pids[@]}" 2>/dev/null || true
  sim_cluster_pids=()
}

start_sim_cluster() {
  local d=$1 n=$2 wflags=$3 rflags=$4 workers="" i
  rm -rf "$d"; mkdir -p "$d"
  worker_pids=()
  for i in $(seq "$n"); do
    # shellcheck disable=SC2086  # flags: words
    "$B/tailserve-worker" --config ladb_config.yaml --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
      --log-level warn --ports-file "$d/w$i" $wflags > "$d/w$i.log" 2>&1 &
    sim_cluster_pids+=($!)
    worker_pids+=($!)
  done
  for i in $(seq "$n"); do
    for _ in $(seq 100); do [ -s "$d/w$i" ] && break; sleep 0.05; done
    workers+="${workers:+,}127.0.0.1:$(sed -n 's/grpc_port=//p' "$d/w$i")"
  done
  # shellcheck disable=SC2086  # flags: words
  "$B/tailserve-router" --config ladb_config.yaml --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
    --log-level warn --workers "$workers" --ports-file "$d/r" $rflags > "$d/r.log" 2>&1 &
  sim_cluster_pids+=($!)
  router_pid=$!
  for _ in $(seq 100); do [ -s "$d/r" ] && break; sleep 0.05; done
  router_grpc=$(sed -n 's/grpc_port=//p' "$d/r")
  router_http=$(sed -n 's/http_port=//p' "$d/r")
  for _ in $(seq 100); do curl -sf "localhost:$router_http/readyz" > /dev/null && break; sleep 0.1; done
}
