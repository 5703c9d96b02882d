#!/usr/bin/env bash
# Starts a router (HTTP API on a free port, API keys) and a CPU worker on the default model, then
# runs the official OpenAI client's checks (tests/openai_client_test.mjs) against it.
#   openai_client_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
SRC=$1
BIN=$2
d=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; rm -rf "$d"; }
trap cleanup EXIT
good=ts-good-$RANDOM$RANDOM
limited=ts-limited-$RANDOM$RANDOM
{
  echo "# made by openai_client_test.sh"
  echo "good sha256:$(printf %s "$good" | sha256sum | cut -d' ' -f1)"
  echo "limited sha256:$(printf %s "$limited" | sha256sum | cut -d' ' -f1) rate=0.5 burst=1"
} > "$d/keys"
port_of() { for _ in $(seq 300); do v=$(sed -n "s/^$2=//p" "$1" 2>/dev/null); [ -n "$v" ] && echo "$v" && return; sleep 0.1; done; echo "no $2 in $1" >&2; exit 1; }
"$BIN/tailserve-worker" --config "$SRC/ladb_config.yaml" --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
  --log-level warn --ports-file "$d/w" --set worker.backend=cpu --set worker.model_path="$SRC/models/tiny-en" > "$d/w.log" 2>&1 &
pids+=($!)
w=$(port_of "$d/w" grpc_port)
"$BIN/tailserve-router" --config "$SRC/ladb_config.yaml" --grpc-port 0 --http-port 0 --listen-host 127.0.0.1 \
  --log-level warn --ports-file "$d/r" --workers "127.0.0.1:$w" --set router.model_path="$SRC/models/tiny-en" \
  --set router.api_port=0 --set router.api_keys_file="$d/keys" --set router.api_max_body_bytes=65536 > "$d/r.log" 2>&1 &
pids+=($!)
api=$(port_of "$d/r" api_port)
http=$(port_of "$d/r" http_port)
for _ in $(seq 300); do curl -sf "localhost:$http/readyz" > /dev/null && break; sleep 0.1; done
# A body over router.api_max_body_bytes: 413 in OpenAI's error shape, and the connection closed.
big=$(head -c 70000 /dev/zero | tr '\0' 'a')
code=$(curl -s -o "$d/413.json" -w '%{http_code}' "http://127.0.0.1:$api/v1/completions" -H "Authorization: Bearer $good" \
  -d "{\"model\": \"tiny-en\", \"prompt\": \"$big\"}")
[ "$code" = 413 ] && grep -q '"code":"request_too_large"' "$d/413.json" || { echo "FAIL 413: $code $(cat "$d/413.json")"; exit 1; }
echo "ok   a body over the limit gets 413"
node "$SRC/tests/openai_client_test.mjs" "$SRC/.deps/node/node_modules" "http://127.0.0.1:$api/v1" \
  "http://127.0.0.1:$http/metrics" "$good" "$limited" || { tail -20 "$d/r.log"; exit 1; }
