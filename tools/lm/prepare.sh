#!/usr/bin/env bash
# Prepares the default model's training on this machine (no GPU): builds the corpus from Debian
# packages (tools/lm/corpus/build.sh), makes documents and the held-out split (tools/lm/corpus.py),
# trains the BPE tokenizer (tools/lm/bpe_train.py, 8192 tokens) and packs what the device call
# needs into .lm/ (ignored by git): corpus.tar.xz and tokenizer/. Then, on the lent GPU with
# carry [".lm"]: bash tools/lm/device_train.sh; back here: bash tools/lm/unpack.sh DIR.
# Needs /usr/bin/python3 with python3-regex (Debian); WORK (/tmp/lm-corpus) keeps the downloads.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-/tmp/lm-corpus}
WORK=$WORK bash tools/lm/corpus/build.sh
/usr/bin/python3 tools/lm/corpus.py --prose "$WORK/prose" --out "$WORK/docs"
[ -s "$WORK/tokenizer/tokenizer.json" ] ||
  /usr/bin/python3 tools/lm/bpe_train.py --corpus "$WORK/docs/train.txt" --vocab-size "${VOCAB:-8192}" --out "$WORK/tokenizer"
rm -rf .lm && mkdir -p .lm
cp -r "$WORK/tokenizer" .lm/tokenizer
tar -C "$WORK/docs" -cf - train.txt heldout.txt SOURCES.tsv | xz -T2 -6 > .lm/corpus.tar.xz
xz -T2 -6 -c "$WORK/docs/heldout.txt" > .lm/heldout.txt.xz  # tools/lm/device_reference.sh
du -sh .lm
