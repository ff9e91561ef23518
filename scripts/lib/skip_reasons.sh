#!/usr/bin/env bash
# Says why each test that ctest skipped was skipped. ctest's summary names them
# ("62 - netns_test (Skipped)") but never shows their output, where the reason is.
#
#   scripts/lib/skip_reasons.sh CTEST_OUTPUT LAST_TEST_LOG
#
# CTEST_OUTPUT: what ctest printed (its "The following tests did not run:" list).
# LAST_TEST_LOG: the build's Testing/Temporary/LastTest.log (every test's whole output).
# Prints one line per skipped test, "  NAME: REASON", in the log's order, after one heading line;
# nothing when no test was skipped. A reason is the first of these in the test's output:
#   "SKIP: why"                         (tests/netns/netns_lib.sh)
#   "...: Skipped" then "why"           (GoogleTest's GTEST_SKIP)
#   "skipped: why", "# skipped: why"    (CMake's placeholders, the nccl bench)
# A skipped test whose output has none of them is listed with "(no reason in its output)".
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: scripts/lib/skip_reasons.sh CTEST_OUTPUT LAST_TEST_LOG" >&2
  exit 2
fi
out=$1
log=$2
mapfile -t names < <(sed -n 's/^[[:space:]]*[0-9][0-9]* - \(.*\) (Skipped)$/\1/p' "$out")
((${#names[@]} > 0)) || exit 0
echo "skipped tests, and why:"
if [[ ! -r "$log" ]]; then
  for n in "${names[@]}"; do echo "  $n: (no $log to read the reason from)"; done
  exit 0
fi
awk -v names="${names[*]}" '
  BEGIN { n = split(names, list, " "); for (i = 1; i <= n; i++) wanted[list[i]] = 1 }
  # "62/125 Testing: netns_test" opens a test'"'"'s record; its output runs from the dashes after
  # "Output:" to "<end of output>".
  /^[0-9]+\/[0-9]+ Testing: / { cur = $3; inout = 0; reason = ""; next_line = 0; next }
  /^Output:$/ { expect_dashes = 1; next }
  expect_dashes && /^-+$/ { expect_dashes = 0; inout = 1; next }
  /^<end of output>$/ {
    if (inout && (cur in wanted) && !(cur in said)) {
      print "  " cur ": " (reason == "" ? "(no reason in its output)" : reason)
      said[cur] = 1
    }
    inout = 0
    next
  }
  inout && (cur in wanted) && reason == "" {
    if (next_line) { reason = $0; next_line = 0 }
    else if ($0 ~ /: Skipped$/) next_line = 1
    else if ($0 ~ /^SKIP: /) reason = substr($0, 7)
    else if ((i = index($0, "skipped: ")) > 0) reason = substr($0, i + 9)
  }
  END {
    for (i = 1; i <= n; i++)
      if (!(list[i] in said)) print "  " list[i] ": (not in the test log)"
  }
' "$log"
