#!/usr/bin/env bash
# scripts/lib/skip_reasons.sh on a hand-made ctest run: each way a test says why it skipped
# (netns_lib's "SKIP:", GoogleTest's "Skipped" line, CMake's "skipped:" placeholder), a skipped
# test that says nothing, one missing from the log, and passed tests whose output looks like a
# reason (they must not be listed).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tool=$root/scripts/lib/skip_reasons.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

record() {  # record NUMBER NAME OUTPUT-LINES...: one test's record as ctest writes it
  local num=$1 name=$2
  shift 2
  echo "$num/9 Testing: $name"
  echo "$num/9 Test: $name"
  echo "Command: \"/usr/bin/bash\" \"$name.sh\""
  echo "Output:"
  echo "----------------------------------------------------------"
  printf '%s\n' "$@"
  echo "<end of output>"
  echo "Test time =   0.01 sec"
  echo "----------------------------------------------------------"
  echo "Test Passed."
  echo
}
{
  echo "Start testing: Nov 30 08:21 UTC"
  echo "----------------------------------------------------------"
  record 1 passing_test "# skipped: not really, this test passed" "SKIP: nor this"
  record 2 netns_test "SKIP: needs root to create network namespaces"
  record 3 pg_nccl_test "[ RUN      ] NcclDevice.One" "/x/nccl_device_test.cc:21: Skipped" \
    "no CUDA device" "[  SKIPPED ] NcclDevice.One (0 ms)" "x.cc:30: Skipped" "a later reason"
  record 4 python_torch2_test "skipped: torch 2.x: PyPI unreachable"
  record 5 nccl_direct_bench "# nccl bench" "# skipped: no CUDA device"
  record 6 quiet_test "nothing to say"
  echo "End testing: Nov 30 08:22 UTC"
} >"$tmp/LastTest.log"
cat >"$tmp/ctest.out" <<'OUT'
100% tests passed, 0 tests failed out of 9

The following tests did not run:
	  2 - netns_test (Skipped)
	  3 - pg_nccl_test (Skipped)
	  4 - python_torch2_test (Skipped)
	  5 - nccl_direct_bench (Skipped)
	  6 - quiet_test (Skipped)
	  7 - gone_test (Skipped)
	  8 - off_test (Disabled)
OUT
got=$("$tool" "$tmp/ctest.out" "$tmp/LastTest.log")
want="skipped tests, and why:
  netns_test: needs root to create network namespaces
  pg_nccl_test: no CUDA device
  python_torch2_test: torch 2.x: PyPI unreachable
  nccl_direct_bench: no CUDA device
  quiet_test: (no reason in its output)
  gone_test: (not in the test log)"
[[ "$got" == "$want" ]] || fail "got:
$got
want:
$want"

# No skipped test: nothing at all.
echo "100% tests passed, 0 tests failed out of 1" >"$tmp/clean.out"
got=$("$tool" "$tmp/clean.out" "$tmp/LastTest.log")
[[ -z "$got" ]] || fail "a run without skips printed: $got"

# No log (ctest never ran a test): each name, and that the reason could not be read.
got=$("$tool" "$tmp/ctest.out" "$tmp/missing.log" | sed -n 2p)
[[ "$got" == "  netns_test: (no $tmp/missing.log to read the reason from)" ]] ||
  fail "without a log: $got"

# Wrong use: exit 2 with the usage.
rc=0
"$tool" "$tmp/ctest.out" 2>"$tmp/usage" || rc=$?
if [[ $rc != 2 ]] || ! grep -q "usage:" "$tmp/usage"; then
  fail "one argument: exit $rc, $(cat "$tmp/usage")"
fi
echo "skip_reasons_test: ok"
