#!/usr/bin/env bash
# What transformers computes for a checkpoint of tools/lm (tools/lm/reference.py: logits and greedy
# continuations) and what HuggingFace tokenizers gives for its tokenizer (tools/lm/tokenizer_cases.py),
# into DEST (default: CKPT/reference). On the device machine, which has both; the held-out documents
# come from HELDOUT (default: .lm/heldout.txt.xz, written by tools/lm/prepare.sh). For the shipped
# model: device call with carry [".lm/heldout.txt.xz"]: OUT=$OUT bash tools/lm/device_reference.sh,
# DEST=$OUT/reference, then copy the files back into models/tiny-en/reference.
set -euo pipefail
CKPT=${CKPT:-models/tiny-en}
DEST=${DEST:-$CKPT/reference}
HELDOUT=${HELDOUT:-.lm/heldout.txt.xz}
mkdir -p "$DEST"
if [ "${HELDOUT%.xz}" != "$HELDOUT" ]; then
  xz -dc "$HELDOUT" > /tmp/lm-heldout.txt
  HELDOUT=/tmp/lm-heldout.txt
fi
python3 tools/lm/reference.py --checkpoint "$CKPT" --out "$DEST"
python3 tools/lm/tokenizer_cases.py --tokenizer "$CKPT" --heldout "$HELDOUT" --out "$DEST/tokenizer_cases.json"
