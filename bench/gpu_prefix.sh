#!/usr/bin/env bash
# Prefix caching on the GPU (issue 69): one CUDA worker serving the 8B shape (synthetic weights,
# FP8 KV) behind the router, multi-turn chat (tailserve-load --chat-users: USERS conversations
# started at RATE a second, TURNS turns each re-sending the conversation as it was streamed, a
# SYSTEM-token system prompt all share, ~128-token messages and answers, 2 s between an answer and
# the next turn), once per arm in ARMS: nocache (worker.prefix_caching=false) and cache. Random
# weights never emit EOS, so each request asks for up to 4096 tokens and the client hangs up at
# its planned length (--client-stop). The router gets a folder with the checkpoint's config.json
# and tiny-en's tokenizer: token-id prompts are checked against the config's vocabulary only.
# Each arm's load summary (JSON) and worker metrics land in $OUT/prefix; bench/prefix_gpu_table.py
# prints the table and the prefill time saved per hit token.
#   bash bench/gpu_run.sh prefix (after bench/gpu_pack.sh with SERVE=1)
# The sim's side, on any machine, from the GPU run's router-model folder (the 8B's config.json) and
# its cache-off worker's step-cost fit: SERVE_BACKEND=sim SERVE_BIN_DIR=build/bin
# SERVE_CKPT=<OUT>/prefix/router-model WORKER_FLAGS="--set worker.sim.vocab_size=128256
# --set worker.sim.kv_blocks=<the CUDA worker's> --set worker.sim.step_base_ms=<a> ..." bash bench/gpu_prefix.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
D=$OUT/prefix
mkdir -p "$D"
ARMS=${ARMS:-"nocache cache"}
USERS=${USERS:-100}
TURNS=${TURNS:-4}
RATE=${RATE:-2.5}
SYSTEM=${SYSTEM:-1024}
SEED=${SEED:-1}
CKPT=${SERVE_CKPT:-/tmp/ckpt/l8b}
BACKEND=${SERVE_BACKEND:-cuda}
B=${SERVE_BIN_DIR:-.gpu/bin}
# shellcheck source=bench/gpu_serve_lib.sh
source bench/gpu_serve_lib.sh
trap stop EXIT

rmodel=$D/router-model
mkdir -p "$rmodel"
cp "$CKPT/config.json" "$rmodel/" && cp models/tiny-en/tokenizer.json "$rmodel/"
vocab=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$CKPT/config.json")
for arm in $ARMS; do
  caching=false; [ "$arm" = cache ] && caching=true
  r=$D/run; rm -rf "$r"; mkdir -p "$r"
  t0=$SECONDS
  start_worker "$r" "$D/$arm.wlog" --set worker.backend="$BACKEND" --set worker.model_path="$CKPT" \
    --set worker.prefix_caching=$caching ${WORKER_FLAGS:-} || continue
  start_router "$r" "$D/$arm.rlog" "127.0.0.1:$w_grpc" --set router.model_path="$(realpath "$rmodel")" \
    --set predictor.model_path= --set router.max_prompt_tokens=16384 || continue
  echo "== $arm: serving after $((SECONDS - t0)) s"
  timeout 300 .gpu/run "$B/tailserve-load" --target "127.0.0.1:$r_grpc" --chat-users "$USERS" --chat-turns "$TURNS" \
    --chat-rate "$RATE" --chat-system-tokens "$SYSTEM" --chat-user-tokens 128 --chat-answer-tokens 128 \
    --chat-think-s 2 --client-stop --vocab "$vocab" --seed "$SEED" --timeout-s 120 --json "$D/$arm.json" \
    > "$D/$arm.load" 2>&1
  curl -s "localhost:$w_http/metrics" > "$D/$arm.wmetrics"
  stop
  echo "$arm: done after $((SECONDS - t0)) s"
done
python3 bench/prefix_gpu_table.py "$D" $ARMS | tee "$D/table.md"
