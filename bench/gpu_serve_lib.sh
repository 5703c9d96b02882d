# What the GPU serving benchmarks share (bench/gpu_serve.sh, bench/gpu_prefix.sh): one worker and a
# router on loopback ports chosen at start, both reading ladb_config.yaml, run through .gpu/run from
# $B. Sourced. A worker that refuses its configuration fails the start at once, so it cannot hold
# the device for minutes.
#   start_worker DIR LOG FLAGS...         sets w_grpc, w_http; returns 1 when it did not start
#   start_router DIR LOG WORKER FLAGS...  sets r_grpc, r_http; waits for /readyz
#   stop                                  kills both
# shellcheck shell=bash

pids=()
stop() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; pids=(); }

# Waits up to $2 tenths of a second for file $1, giving up at once when process $3 has exited.
wait_file() {
  for _ in $(seq "$2"); do
    [ -s "$1" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
port_of() { sed -n "s/$2=//p" "$1"; }

start_worker() {
  local dir=$1 log=$2; shift 2
  .gpu/run "$B/tailserve-worker" --config ladb_config.yaml --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
    --log-level warn --ports-file "$dir/w" "$@" > "$log" 2>&1 &
  pids+=($!)
  if ! wait_file "$dir/w" 3000 "${pids[-1]}"; then echo "the worker did not start"; tail -5 "$log"; stop; return 1; fi
  w_grpc=$(port_of "$dir/w" grpc_port)
  w_http=$(port_of "$dir/w" http_port)
}

start_router() {
  local dir=$1 log=$2 worker=$3; shift 3
  .gpu/run "$B/tailserve-router" --config ladb_config.yaml --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
    --log-level warn --workers "$worker" --ports-file "$dir/r" "$@" > "$log" 2>&1 &
  pids+=($!)
  if ! wait_file "$dir/r" 200 "${pids[-1]}"; then echo "the router did not start"; tail -5 "$log"; stop; return 1; fi
  r_grpc=$(port_of "$dir/r" grpc_port)
  r_http=$(port_of "$dir/r" http_port)
  for _ in $(seq 600); do curl -sf "localhost:$r_http/readyz" > /dev/null && break; sleep 0.5; done
}
