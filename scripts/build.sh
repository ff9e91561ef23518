#!/usr/bin/env bash
# Configures and builds Loom into build/ (binaries in build/bin, tests in build/tests).
# Extra arguments go to the CMake configure step, e.g. -DLOOM_SANITIZE=thread.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${LOOM_BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${LOOM_BUILD_TYPE:-RelWithDebInfo} "$@"
cmake --build "$BUILD_DIR" -j "$jobs"
