#!/usr/bin/env bash
# README command (2): install what is missing, build, and run the whole test suite.
# CI runs exactly this (.ci/run). Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Everything on, whatever an earlier scripts/run.sh chose for a fresh build directory.
scripts/build.sh -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_BENCH=ON -DLOOM_BUILD_BENCH_SUITES=ON \
  -DLOOM_BUILD_EXAMPLES=ON "$@"
status=0
(cd "${LOOM_BUILD_DIR:-build}" && ctest --output-on-failure --timeout 600 ${LOOM_CTEST_ARGS:-}) ||
  status=$?
# The fuzz targets, built with clang in build-fuzz, each run for a fixed number of inputs
# (docs/fuzz.md); LOOM_SKIP_FUZZ=1 leaves them out.
if [[ "${LOOM_SKIP_FUZZ:-0}" != 1 ]]; then
  tests/fuzz/run.sh || status=1
fi
exit "$status"
