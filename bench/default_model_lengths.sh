#!/usr/bin/env bash
# The default model's output lengths and the length predictor trained on them, end to end: a router
# and WORKERS CPU workers serving models/tiny-en, sent its held-out prompt set
# (models/tiny-en/reference/prompts.jsonl: openings of held-out documents, temperature 0/0.7/1.0,
# max_tokens 256) at RATE per second; the model ends each answer itself (EOS) or at max_tokens.
# The router's feedback log (predictor.feedback_log) then trains a predictor with tailserve-train,
# whose error on the log's held-out tail (HOLDOUT) is printed beside the constant-length baseline's.
# Prints the load table (with the output-length percentiles), the lengths by temperature, and the
# predictor table.
#   bench/default_model_lengths.sh [RATE=4] [WORKERS=2] [HOLDOUT=0.3] [OUT=bench/out/lengths]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-4}
WORKERS=${WORKERS:-2}
HOLDOUT=${HOLDOUT:-0.3}
MODEL=${MODEL:-models/tiny-en}
OUT=${OUT:-bench/out/lengths}
B=build/bin
mkdir -p "$OUT"
# shellcheck source=bench/sim_cluster.sh
. bench/sim_cluster.sh
trap stop_sim_cluster EXIT
FEEDBACK=$(realpath "$OUT")/feedback.jsonl
rm -f "$FEEDBACK"
start_sim_cluster "$OUT/cluster" "$WORKERS" "--backend cpu --model $MODEL --set worker.threads=1" \
  "--model $MODEL --set predictor.feedback_log=$FEEDBACK --set predictor.update_interval_ms=100"
"$B/tailserve-load" --target "127.0.0.1:$router_grpc" --prompts "$MODEL/reference/prompts.jsonl" --requests 0 \
  --rate "$RATE" --seed 1 --json "$OUT/load.json" | tee "$OUT/load.txt"
stop_sim_cluster
python3 - "$FEEDBACK" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n| temperature | requests | output tokens P10 | P50 | P90 | ended before max_tokens |")
print("|---:|---:|---:|---:|---:|---:|")
for t in sorted({r["features"]["temperature"] for r in rows}):
    n = sorted(r["actual_steps"] for r in rows if r["features"]["temperature"] == t)
    q = lambda p: n[min(len(n) - 1, int(p * len(n)))]
    cap = [r for r in rows if r["features"]["temperature"] == t and r["actual_steps"] < r["features"]["max_tokens"]]
    print(f"| {t:.1f} | {len(n)} | {q(0.1)} | {q(0.5)} | {q(0.9)} | {100 * len(cap) / len(n):.0f}% |")
PY
echo
"$B/tailserve-train" --feedback "$FEEDBACK" --holdout "$HOLDOUT" --out "$OUT/predictor.onnx" | tee "$OUT/train.txt"
