#!/usr/bin/env bash
# Configures and builds Loom into build/ (binaries in build/bin, tests in build/tests).
# Extra arguments go to the CMake configure step, e.g. -DLOOM_SANITIZE=thread.
# LOOM_BUILD_TARGETS="loom-run loom-bench" builds only those targets (and what they link);
# unset, everything is built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${LOOM_BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${LOOM_BUILD_TYPE:-RelWithDebInfo} "$@"
targets=()
if [[ -n "${LOOM_BUILD_TARGETS:-}" ]]; then
  read -r -a names <<<"$LOOM_BUILD_TARGETS"
  targets=(--target "${names[@]}")
fi
cmake --build "$BUILD_DIR" -j "$jobs" "${targets[@]}"
