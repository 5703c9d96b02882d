#!/usr/bin/env bash
# Starts a local tailserve cluster on a fresh Debian machine and shows it serving: a router and two
# CPU workers on the embedded default model (models/tiny-en: a small Llama-architecture model
# trained on public-domain and permissively licensed English, tools/lm), one streamed text request,
# then a short load run of held-out prompts that the model ends itself (EOS), with its P95s and
# output lengths. The cluster keeps running until Ctrl-C (or exits at once with --exit).
# MODEL=/path/to/hf/checkpoint serves another Llama/Qwen2/Mistral/Mixtral checkpoint instead.
#   router: gRPC 127.0.0.1:50051, HTTP :9090 (/metrics /healthz /readyz)
#   workers: gRPC :50061 and :50062, HTTP :9091 and :9092
set -euo pipefail
cd "$(dirname "$0")/.."
EXIT_AFTER=0
[ "${1:-}" = "--exit" ] && EXIT_AFTER=1
bash scripts/build.sh >/tmp/tailserve-demo-build.log 2>&1 || { tail -50 /tmp/tailserve-demo-build.log; exit 1; }
B=build/bin
MODEL=${MODEL:-models/tiny-en}
RUN=.run
mkdir -p "$RUN"
rm -f "$RUN"/*.ports
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for i in 1 2; do
  # One BLAS thread each: the two workers share this machine's cores.
  "$B/tailserve-worker" --config ladb_config.yaml --backend cpu --model "$MODEL" --set worker.threads=1 \
    --listen-host 127.0.0.1 --grpc-port "5006$i" --http-port "909$i" --ports-file "$RUN/worker$i.ports" \
    >"$RUN/worker$i.log" 2>&1 &
  pids+=($!)
done
"$B/tailserve-router" --config ladb_config.yaml --listen-host 127.0.0.1 --grpc-port 50051 --http-port 9090 \
  --model "$MODEL" --workers 127.0.0.1:50061,127.0.0.1:50062 --set router.api_port=8000 \
  --ports-file "$RUN/router.ports" >"$RUN/router.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 300); do
  curl -sf localhost:9090/readyz >/dev/null 2>&1 && break
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a process exited; logs in $RUN/"; tail -5 "$RUN"/*.log; exit 1; }; done
  sleep 0.1
done
curl -sf localhost:9090/readyz >/dev/null || { echo "router not ready; logs in $RUN/"; exit 1; }
echo "== tailserve is up: router 127.0.0.1:50051 (OpenAI API :8000, metrics :9090), workers :50061 :50062 (cpu backend, $MODEL)"
echo
echo "== one streamed request (sampled at temperature 0.8; the model ends it with EOS or at 64 tokens)"
"$B/tailserve-generate" --target 127.0.0.1:50051 --prompt "Once upon a time there was" --max-tokens 64 --seed 42 \
  --temperature 0.8
echo
echo "== a streamed chat completion through the OpenAI API (the model's chat template; first events)"
NAME=$(curl -s localhost:8000/v1/models | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
curl -sN localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d "{\"model\": \"$NAME\",
  \"messages\": [{\"role\": \"user\", \"content\": \"What does a package manager do?\"}], \"max_tokens\": 32,
  \"temperature\": 0.8, \"seed\": 42, \"stream\": true}" > "$RUN/chat.sse"
grep -m 3 '^data' "$RUN/chat.sse"
echo "   ..."
echo
echo "== load: 100 held-out prompts at 8 req/s, up to 256 tokens each, ended by the model"
"$B/tailserve-load" --target 127.0.0.1:50051 --prompts models/tiny-en/reference/prompts.jsonl --requests 100 --rate 8
echo
echo "== the router's own sliding-window P95s (from /metrics)"
curl -s localhost:9090/metrics | grep -E '^tailserve_router_(ttft|e2e_latency|queue_time)_window_seconds\{quantile="0.95"\}'
if [ "$EXIT_AFTER" = 1 ]; then exit 0; fi
echo
echo "Running. Try: $B/tailserve-generate --prompt \"The history of the\";  any OpenAI client at http://127.0.0.1:8000/v1;"
echo "  curl localhost:9090/metrics.  Ctrl-C stops it."
wait
