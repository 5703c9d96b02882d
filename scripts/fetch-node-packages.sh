#!/usr/bin/env bash
# Installs the npm packages the tests run into .deps/node (idempotent), versions pinned:
# @huggingface/jinja, the reference chat-template renderer (tests/jinja_differential.py), and the
# official OpenAI client the HTTP API is tested with (tests/openai_client_test.mjs).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/.deps/node"
PKGS=("@huggingface/jinja@0.5.13" "openai@6.30.1")
missing=()
for p in "${PKGS[@]}"; do
  name=${p%@*}
  version=${p##*@}
  have=$(node -p "require('$DEST/node_modules/$name/package.json').version" 2>/dev/null || true)
  [ "$have" = "$version" ] || missing+=("$p")
done
((${#missing[@]})) || exit 0
mkdir -p "$DEST"
# All of them in one install: npm prunes what an install does not name.
(cd "$DEST" && npm install --no-save --no-audit --no-fund --silent "${PKGS[@]}")
echo "installed ${PKGS[*]} -> $DEST"
