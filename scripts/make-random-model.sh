#!/usr/bin/env bash
# Writes a random-weight model for shapes and benchmarks (the default model, models/tiny-en, is
# trained; see tools/lm): a deterministic synthetic Llama-architecture checkpoint (seed 0, random
# bf16 weights, 4 layers, hidden 256, 8/2 heads, tied embeddings) with the real Llama 3 tokenizer,
# into .deps/models/tiny-llama3 (idempotent). Needs build/bin/tailserve-make-checkpoint.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BUILD_DIR:-$ROOT/build}/bin"
OUT="$ROOT/.deps/models/tiny-llama3"
[ -s "$OUT/model.safetensors" ] && [ -s "$OUT/tokenizer.json" ] && exit 0
"$ROOT/scripts/fetch-tokenizers.sh" >/dev/null
rm -rf "$OUT.tmp"
"$BIN/tailserve-make-checkpoint" --preset tiny --seed 0 --tokenizer "$ROOT/.deps/tokenizers/llama3" --out "$OUT.tmp" >/dev/null
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "random-weight model: $OUT"
