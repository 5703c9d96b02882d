#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs what it needs, builds, runs every test
# (unit and integration) through CTest. GPU tests, when there are any, skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
cd "${BUILD_DIR:-build}"
# The integration tests start their own processes on free ports; one test at a time keeps their
# timing honest on a 2-core machine.
ctest --output-on-failure --timeout 300 -j 1
# Every fuzz target briefly on its corpus (a clang ASan/UBSan build in build-fuzz/; bench/fuzz.sh).
cd - > /dev/null
FUZZ_SECONDS=${FUZZ_SECONDS:-10} bash bench/fuzz.sh --ci
