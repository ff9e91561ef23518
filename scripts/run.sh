#!/usr/bin/env bash
# README command (1): install what is missing, build what the main job needs, and run it: an
# all-reduce benchmark (nccl-tests format, every result checked) over 2 local ranks started by
# loom-run. Only loom-run and loom-bench (and the libraries they link) are built; the test
# command (scripts/test.sh) installs and builds the rest.
# Extra arguments go to loom-bench, e.g. scripts/run.sh --op all_gather -e 16M.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --core
configure=()
if [[ ! -f "${LOOM_BUILD_DIR:-build}/CMakeCache.txt" ]]; then
  # A fresh build directory: leave out what needs the test-only packages. A build directory
  # that exists keeps its own choices (scripts/test.sh turns these on).
  configure=(-DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH_SUITES=OFF -DLOOM_BUILD_EXAMPLES=OFF)
fi
LOOM_BUILD_TARGETS="loom-run loom-bench" scripts/build.sh "${configure[@]}"
exec "${LOOM_BUILD_DIR:-build}"/bin/loom-run --nproc-per-node "${LOOM_NPROC:-2}" -- \
  "${LOOM_BUILD_DIR:-build}"/bin/loom-bench --op all_reduce -b 16 -e 64M -f 4 -n 20 -w 5 -c 1 "$@"
