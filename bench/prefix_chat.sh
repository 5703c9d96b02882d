#!/usr/bin/env bash
# Prefix caching and cache-aware placement on multi-turn chat (tailserve-load --chat-users: USERS
# conversations started at RATE a second, TURNS turns each re-sending the conversation as it was
# streamed, a SYSTEM-token system prompt they all share, ~USER_TOKENS-token messages and
# ~ANSWER_TOKENS-token answers, THINK_S between an answer and the next turn), against a router +
# WORKERS sim workers (a paged KV cache of KV_BLOCKS 16-token blocks; the sim charges prefill only
# for the tokens it computes), all in the default slo mode, once per arm:
#   nocache  worker.prefix_caching=false, no cache-aware placement, no session affinity
#   cache    prefix caching on, placement by predicted TTFT from load alone
#   session  ... and session affinity (router.session_affinity), no prefix index
#   aware    ... and cache-aware placement (router.cache_aware_routing): the default
# Prints, per arm: the served prompt tokens' cached share (from usage) beside an unbounded cache's,
# TTFT and E2E percentiles, throughput, goodput, and the busiest worker's sequences over the mean
# (the shared system prompt is a hot prefix: affinity must not pin traffic to one worker).
#   bench/prefix_chat.sh [USERS=200] [TURNS=4] [RATE=8] [ARMS="nocache cache session aware"] [OUT=bench/out/chat]
# ROUTER_FLAGS: more router flags for every arm (e.g. "--set router.max_load_imbalance=1.5").
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${USERS:-200}
TURNS=${TURNS:-4}
RATE=${RATE:-8}
SYSTEM=${SYSTEM:-1024}
USER_TOKENS=${USER_TOKENS:-128}
ANSWER_TOKENS=${ANSWER_TOKENS:-128}
THINK_S=${THINK_S:-2}
WORKERS=${WORKERS:-4}
KV_BLOCKS=${KV_BLOCKS:-53000}
ARMS=${ARMS:-"nocache cache session aware"}
SEED=${SEED:-1}
OUT=${OUT:-bench/out/chat}
B=build/bin
mkdir -p "$OUT"

arm_flags() {  # $1: arm → worker flags|router flags
  case "$1" in
    nocache) echo "--set worker.prefix_caching=false|--set router.cache_aware_routing=false --set router.session_affinity=false" ;;
    cache) echo "--set worker.prefix_caching=true|--set router.cache_aware_routing=false --set router.session_affinity=false" ;;
    session) echo "--set worker.prefix_caching=true|--set router.cache_aware_routing=false --set router.session_affinity=true" ;;
    aware) echo "--set worker.prefix_caching=true|--set router.cache_aware_routing=true --set router.session_affinity=true" ;;
  esac
}

# shellcheck source=bench/sim_cluster.sh
source bench/sim_cluster.sh
trap stop_sim_cluster EXIT
for arm in $ARMS; do
  flags=$(arm_flags "$arm")
  start_sim_cluster "$OUT/run" "$WORKERS" "--set worker.sim.kv_blocks=$KV_BLOCKS ${flags%%|*}" \
    "--set predictor.model_path= ${flags#*|} ${ROUTER_FLAGS:-}"
  echo "== chat $arm: $USERS conversations x $TURNS turns at $RATE/s" >&2
  "$B/tailserve-load" --target "127.0.0.1:$router_grpc" --chat-users "$USERS" --chat-turns "$TURNS" \
    --chat-rate "$RATE" --chat-system-tokens "$SYSTEM" --chat-user-tokens "$USER_TOKENS" \
    --chat-answer-tokens "$ANSWER_TOKENS" --chat-think-s "$THINK_S" --sim-eos --seed "$SEED" \
    --json "$OUT/$arm.json" >&2 || true
  for i in $(seq "$WORKERS"); do
    curl -s "localhost:$(sed -n 's/http_port=//p' "$OUT/run/w$i")/metrics" | grep -E '^tailserve_worker_sequences_total' |
      awk -v w="$i" '{s += $2} END {print w, s}'
  done > "$OUT/$arm.workers"
  stop_sim_cluster
done
python3 - "$OUT" $ARMS <<'PY'
import json, sys
out, arms = sys.argv[1], sys.argv[2:]
ms = lambda q: " / ".join(f"{1000 * q[p]:.0f}" if q[p] is not None else "–" for p in ("p50", "p95", "p99"))
print("| arm | ok/sent | cached (served) | unbounded cache | TTFT P50 / P95 / P99 ms | E2E P50 / P95 / P99 ms "
      "| req/s | goodput req/s | busiest / mean worker |")
print("|---|---:|---:|---:|---|---|---:|---:|---:|")
for arm in arms:
    r = json.load(open(f"{out}/{arm}.json"))
    seqs = [float(l.split()[1]) for l in open(f"{out}/{arm}.workers") if l.strip()]
    balance = max(seqs) / (sum(seqs) / len(seqs)) if seqs and sum(seqs) else float("nan")
    print(f"| {arm} | {r['ok']}/{r['requests']} | {100 * r['cached_prompt_tokens'] / max(1, r['prompt_tokens']):.1f}% | "
          f"{100 * r['oracle_cached_tokens'] / max(1, r['oracle_prompt_tokens']):.1f}% | {ms(r['ttft_s'])} | "
          f"{ms(r['e2e_s'])} | {r['throughput_rps']:.2f} | {r['goodput_rps']:.2f} | {balance:.2f} |")
PY
