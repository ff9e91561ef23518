#!/usr/bin/env bash
# Runs the python suite (python/tests) under each torch VERSION from PyPI: the torches the README's
# test command does not run (it runs Debian's 1.13 and one 2.x, LOOM_TORCH2_VERSION).
#
#   scripts/torch_matrix.sh 2.4.1 2.8.0 2.11.0      # each: install, build the module, pytest
#   scripts/torch_matrix.sh --remove-envs 2.1.2     # remove each environment after its run
#
# For each version: scripts/setup_torch.sh installs it (an environment under LOOM_PY_ENVS that
# later runs reuse), the loom_torch module is built against it, and pytest runs the suite with
# that module. Wheels of the pre-C++11 libstdc++ ABI (PyPI's torch before 2.7) need all of Loom
# built with that ABI, so there is one build directory per ABI: LOOM_MATRIX_DIR (default
# build-torch-matrix)/abi0 and abi1; versions of one ABI share its Loom libraries and rebuild
# only the module. Ends with one line per version: its ABI, the suite's counts, the wall time.
#
# Exit status: 0 when every version's suite passed; 1 when any did not (a failed test, a build
# or install that failed, PyPI unreachable); 2 on wrong use.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: scripts/torch_matrix.sh [--remove-envs] VERSION..." >&2
  echo "  VERSION: a torch release on PyPI of 2.1 or newer, e.g. 2.4.1 (torch_compat.h)" >&2
  exit 2
}
remove_envs=0
versions=()
for arg in "$@"; do
  case "$arg" in
    --remove-envs) remove_envs=1 ;;
    -h | --help) usage ;;
    -*) echo "torch_matrix: unknown option '$arg'" >&2; usage ;;
    *)
      if [[ ! "$arg" =~ ^2\.([0-9]+)\.[0-9]+$ ]] || ((BASH_REMATCH[1] < 1)); then
        echo "torch_matrix: '$arg' is not a torch 2.x version of the form 2.m.p with m >= 1" >&2
        usage
      fi
      versions+=("$arg")
      ;;
  esac
done
((${#versions[@]} > 0)) || usage

root=$PWD
matrix_dir=${LOOM_MATRIX_DIR:-build-torch-matrix}
mkdir -p "$matrix_dir"
logs="$matrix_dir/logs"
mkdir -p "$logs"
envs=${LOOM_PY_ENVS:-$HOME/.cache/loom/py}
summary=()
status=0
line() {  # line RESULT: the summary line of the current version
  summary+=("$(printf '%-8s %-5s %-60s %4d s' "$version" "${abi:-?}" "$1" $((SECONDS - start)))")
}
for version in "${versions[@]}"; do
  start=$SECONDS
  abi=""
  echo "=== torch $version" >&2
  setup_rc=0
  py=$(scripts/setup_torch.sh "$version" | tail -1) || setup_rc=$?
  if ((setup_rc != 0)); then
    line "not installed (scripts/setup_torch.sh exit $setup_rc)"
    status=1
    continue
  fi
  abi=$("$py" -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
  build="$matrix_dir/abi$abi"
  build_log="$logs/build-$version.log"
  # Only what the suite uses: the module, loom-run (its ranks) and loom-bench (the bench scripts).
  if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DLOOM_WITH_TORCH=ON "-DLOOM_PYTHON=$py" -DLOOM_TORCH2_PYTHON= -DLOOM_BUILD_TESTS=OFF \
      -DLOOM_BUILD_BENCH_SUITES=OFF -DLOOM_BUILD_EXAMPLES=OFF &&
    cmake --build "$build" --target loom_torch loom-run loom-bench; } >"$build_log" 2>&1; then
    tail -20 "$build_log" >&2
    line "build failed ($build_log)"
    status=1
    continue
  fi
  test_log="$logs/pytest-$version.log"
  # From the module's own directory: python -m puts the working directory first on sys.path.
  test_rc=0
  (cd "$build/python" && PYTHONPATH="$PWD" LOOM_RUN="$PWD/../bin/loom-run" \
    timeout 900 "$py" -m pytest -q -p no:cacheprovider -rs "$root/python/tests") \
    >"$test_log" 2>&1 || test_rc=$?
  counts=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$test_log" | tail -1 |
    sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*//')
  grep -E "^SKIPPED" "$test_log" | sed "s/^/  $version /" >&2 || true
  if ((test_rc != 0)); then
    grep -E "^(FAILED|ERROR)|^_{3,} " "$test_log" >&2 || true
    line "FAILED: ${counts:-pytest exit $test_rc} ($test_log)"
    status=1
  else
    line "${counts:-passed}"
  fi
  if ((remove_envs)) && [[ "$py" == "$envs/torch-$version/bin/python" ]]; then
    rm -rf "$envs/torch-$version"
  fi
done
echo
printf '%-8s %-5s %-60s %s\n' torch abi "python suite" wall
printf '%s\n' "${summary[@]}"
exit "$status"
