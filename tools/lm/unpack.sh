#!/usr/bin/env bash
# Joins the checkpoint tools/lm/device_train.sh returned (model.tar.* in DIR, the device call's
# files) into models/tiny-en, with the corpus's sources and licences beside it.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:?usage: tools/lm/unpack.sh DIR_OF_THE_DEVICE_FILES}
DEST=${DEST:-models/tiny-en}
tmp=$(mktemp -d)
cat "$DIR"/model.tar.* | tar -C "$tmp" -xf -
rm -rf "$DEST" && mkdir -p "$(dirname "$DEST")" && mv "$tmp/model" "$DEST"
rmdir "$tmp"
WORK=${WORK:-/tmp/lm-corpus}
[ -f "$WORK/docs/SOURCES.tsv" ] && cp "$WORK/docs/SOURCES.tsv" "$DEST/SOURCES.tsv"
du -sh "$DEST"; ls -la "$DEST" "$DEST/reference"
