#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz (every library instrumented for
# coverage, AddressSanitizer and UndefinedBehaviorSanitizer: -DLOOM_SANITIZE=fuzzer) and runs
# each for a fixed number of inputs from a fixed seed (ctest -L fuzz; docs/fuzz.md). Exits
# non-zero when a target crashes, a sanitizer reports, or a property fails.
#
#   tests/fuzz/run.sh [CMAKE_ARGS...]      e.g. -DLOOM_FUZZ_RUNS=100000
# LOOM_FUZZ_BUILD_DIR (default build-fuzz) names the build directory. LOOM_FUZZ_STEP=build only
# configures and builds, LOOM_FUZZ_STEP=run only runs what was built (scripts/test.sh builds
# while the main suite runs); unset, both.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${LOOM_FUZZ_BUILD_DIR:-build-fuzz}
step=${LOOM_FUZZ_STEP:-all}
case "$step" in
  all | build | run) ;;
  *) echo "fuzz: LOOM_FUZZ_STEP must be build, run or unset, got '$step'" >&2
     exit 2 ;;
esac
if [[ "$step" == run ]]; then
  if [[ ! -f "$dir/CTestTestfile.cmake" ]]; then
    echo "fuzz: nothing built in $dir (LOOM_FUZZ_STEP=build first)" >&2
    exit 1
  fi
  exec ctest --test-dir "$dir" -L fuzz --output-on-failure -j "$(nproc)"
fi
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ is missing (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
# Release-like code with assertions on: -O1 keeps the fuzzers fast and the stacks readable. The
# optional backends and the PyTorch package are not needed by any target.
cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DLOOM_SANITIZE=fuzzer \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
  -DLOOM_WITH_TORCH=OFF -DLOOM_WITH_NCCL=OFF -DLOOM_WITH_VERBS=OFF -DLOOM_WITH_MPI=OFF \
  -DLOOM_BUILD_BENCH=OFF "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)" --target loom_fuzzers
[[ "$step" == build ]] && exit 0
ctest --test-dir "$dir" -L fuzz --output-on-failure -j "$(nproc)"
