#!/usr/bin/env bash
# README command (2): install what is missing, build, and run the whole test suite.
# CI runs exactly this (.ci/run). Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
cd "${LOOM_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 ${LOOM_CTEST_ARGS:-}
