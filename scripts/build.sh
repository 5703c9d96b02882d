#!/usr/bin/env bash
# Installs dependencies (Debian packages) and builds everything into build/ (binaries in build/bin).
# BUILD_DIR and BUILD_TYPE may be set; extra arguments go to cmake (e.g. -DTAILSERVE_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
