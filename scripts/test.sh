#!/usr/bin/env bash
# README command (2): install what is missing, build, and run the whole test suite.
# CI runs exactly this (.ci/run). Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
status=0
# torch 2.x beside Debian's torch 1.13 (docs/torch.md, "Torch versions"): scripts/setup_torch.sh
# installs it from PyPI into an environment outside the clone that later runs reuse; the build
# compiles a second loom_torch module against it (build/python-torch2, from the Loom libraries
# already built) and ctest runs the pytest suite under it (python_torch2_test). Where PyPI is
# unreachable, one line says so and python_torch2_test is skipped with that reason.
# LOOM_TORCH2_VERSION picks the version; LOOM_SKIP_TORCH2=1 leaves it out, and the torches below.
# LOOM_TORCH_MORE_VERSIONS (default 2.11.0: the torch of the lent GPU machines, which lacks calls
# 2.15 has; docs/torch.md "Torch versions") get the same, each its own module and ctest
# (python_torch_<version>_test); scripts/torch_matrix.sh runs any other.
# install_torch VERSION: sets torch_python (installed) or torch_skip (why not; a failed install
# also fails the command).
install_torch() {
  torch_python=""
  torch_skip=""
  if [[ "${LOOM_SKIP_TORCH2:-0}" == 1 ]]; then
    torch_skip="LOOM_SKIP_TORCH2=1"
  else
    local rc=0 out
    out=$(scripts/setup_torch.sh "$1") || rc=$?
    case "$rc" in
      0) torch_python=${out##*$'\n'} ;;
      3) torch_skip="PyPI unreachable, torch $1 not installed" ;;
      *) torch_skip="scripts/setup_torch.sh $1 failed (exit $rc)"
         status=1 ;;
    esac
  fi
  if [[ -n "$torch_skip" ]]; then
    echo "test.sh: torch $1 tests skipped: $torch_skip" >&2
  fi
}
torch2_version=${LOOM_TORCH2_VERSION:-2.15.0}
install_torch "$torch2_version"
torch2_python=$torch_python
torch2_skip=$torch_skip
more_pythons=""
more_skipped=""
read -r -a more_versions <<<"${LOOM_TORCH_MORE_VERSIONS-2.11.0}"
for version in "${more_versions[@]}"; do
  install_torch "$version"
  if [[ -n "$torch_python" ]]; then
    more_pythons+="${more_pythons:+;}$torch_python"
  else
    more_skipped+="${more_skipped:+;}$version:${torch_skip//;/,}"
  fi
done
# Everything on, whatever an earlier scripts/run.sh chose for a fresh build directory.
scripts/build.sh -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_BENCH=ON -DLOOM_BUILD_BENCH_SUITES=ON \
  -DLOOM_BUILD_EXAMPLES=ON "-DLOOM_TORCH2_PYTHON=$torch2_python" \
  "-DLOOM_TORCH2_SKIP_REASON=$torch2_skip" "-DLOOM_TORCH_MORE_PYTHONS=$more_pythons" \
  "-DLOOM_TORCH_MORE_SKIPPED=$more_skipped" "$@"
# The fuzz targets (clang, build-fuzz; docs/fuzz.md) build while the suite runs: most
# multi-rank tests wait on deadlines, peers and sockets, so the CPUs are half idle, and at nice 19
# the compiler only takes what the tests leave. They run after the suite, each for a fixed number
# of inputs. LOOM_SKIP_FUZZ=1 leaves them out.
fuzz_pid=""
fuzz_log=""
if [[ "${LOOM_SKIP_FUZZ:-0}" != 1 ]]; then
  fuzz_log=$(mktemp "${TMPDIR:-/tmp}/loom-fuzz-build.XXXXXX")
  LOOM_FUZZ_STEP=build nice -n 19 tests/fuzz/run.sh >"$fuzz_log" 2>&1 &
  fuzz_pid=$!
  # An interrupted run takes its background build with it.
  trap 'kill "$fuzz_pid" 2>/dev/null || true' EXIT
fi
# As many tests at once as there are CPUs (LOOM_CTEST_JOBS): most multi-rank tests spend their
# time waiting (deadlines, peers, sockets), and every test is written to pass on a loaded
# machine; the namespace tests hold one lock (tests/netns).
# ctest's summary names skipped tests without their reasons; scripts/lib/skip_reasons.sh then
# prints each one's reason from the build's test log.
build_dir=${LOOM_BUILD_DIR:-build}
ctest_out=$(mktemp "${TMPDIR:-/tmp}/loom-ctest.XXXXXX")
# shellcheck disable=SC2086 # LOOM_CTEST_ARGS is split into words on purpose
(cd "$build_dir" &&
  ctest --output-on-failure --timeout 600 -j "${LOOM_CTEST_JOBS:-$(nproc)}" ${LOOM_CTEST_ARGS:-}) |
  tee "$ctest_out" || status=$?
scripts/lib/skip_reasons.sh "$ctest_out" "$build_dir/Testing/Temporary/LastTest.log" || true
rm -f "$ctest_out"
if [[ -n "$fuzz_pid" ]]; then
  fuzz_rc=0
  wait "$fuzz_pid" || fuzz_rc=$?
  cat "$fuzz_log"
  rm -f "$fuzz_log"
  if [[ "$fuzz_rc" == 0 ]]; then
    LOOM_FUZZ_STEP=run tests/fuzz/run.sh || status=1
  else
    echo "test.sh: building the fuzz targets failed (exit $fuzz_rc)" >&2
    status=1
  fi
fi
exit "$status"
