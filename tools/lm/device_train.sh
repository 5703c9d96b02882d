#!/usr/bin/env bash
# On the lent GPU (one device call, within its 10 minutes): trains the default model from what
# tools/lm/prepare.sh left in .lm/ (corpus.tar.xz: train.txt and heldout.txt; tokenizer/), then
# writes what transformers computes for it and what HuggingFace tokenizers gives for the test texts
# (tools/lm/device_reference.sh). $OUT gets the checkpoint as tar pieces
# of 15 MiB (a returned file is at most 16 MiB; tools/lm/unpack.sh joins them), training.json and
# the log. LM_SECONDS (360) is the training budget; LM_FLAGS go to train.py.
set -euo pipefail
OUT=${OUT:-/tmp/out}
W=/tmp/lm
rm -rf "$W" && mkdir -p "$W/corpus"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
tar -xJf .lm/corpus.tar.xz -C "$W/corpus"
# shellcheck disable=SC2086  # LM_FLAGS: words
python3 tools/lm/train.py --corpus "$W/corpus" --tokenizer .lm/tokenizer --out "$W/model" \
  --max-seconds "${LM_SECONDS:-360}" ${LM_FLAGS:-} 2>&1 | tee "$OUT/train.log"
CKPT=$W/model HELDOUT=$W/corpus/heldout.txt bash tools/lm/device_reference.sh 2>&1 | tee -a "$OUT/train.log"
cp "$W/model/training.json" "$OUT/"
tar -C "$W" -cf - model | split -b 15m - "$OUT/model.tar."
ls -la "$OUT"
