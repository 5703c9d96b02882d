#!/usr/bin/env bash
# Installs the npm packages the tests run into .deps/node (idempotent), versions pinned:
# @huggingface/jinja, the reference chat-template renderer (tests/jinja_differential.py).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/.deps/node"
PKGS=("@huggingface/jinja@0.5.13")
missing=()
for p in "${PKGS[@]}"; do
  name=${p%@*}
  version=${p##*@}
  have=$(node -p "require('$DEST/node_modules/$name/package.json').version" 2>/dev/null || true)
  [ "$have" = "$version" ] || missing+=("$p")
done
((${#missing[@]})) || exit 0
mkdir -p "$DEST"
(cd "$DEST" && npm install --no-save --no-audit --no-fund --silent "${missing[@]}")
echo "installed ${missing[*]} -> $DEST"
