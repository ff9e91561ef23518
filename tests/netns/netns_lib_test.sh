#!/usr/bin/env bash
# netns_lib.sh's sweep of namespaces that killed runs left behind: one named for a pid that is
# gone (with a process still running in it) and one named for this shell's own pid are removed,
# the process killed; one named for a live process, and one that is not a test's, are kept.
set -uo pipefail
source "$(dirname "$0")/netns_lib.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"

sleep 0 &
dead=$!
wait "$dead"
sleep 120 &
alive=$!
names=("lnz$dead-h0" "lnz$$-sw" "lnz$alive-h0" "loomkeep$$")
cleanup() {
  kill -KILL "$alive" "${inner:-}" 2>/dev/null
  for ns in "${names[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
for ns in "${names[@]}"; do
  netns_add_first "$ns"
done
ip netns exec "lnz$dead-h0" sleep 120 &
inner=$!
for _ in $(seq 100); do [[ -n $(ip netns pids "lnz$dead-h0") ]] && break; sleep 0.05; done
[[ -n $(ip netns pids "lnz$dead-h0") ]] || fail "the process in lnz$dead-h0 did not start"

out=$(netns_sweep_stale)
echo "$out"
have() { ip netns list | awk '{print $1}' | grep -qx "$1"; }
have "lnz$dead-h0" && fail "lnz$dead-h0 (pid $dead is gone) was kept"
have "lnz$$-sw" && fail "lnz$$-sw (this shell's pid: made before this run) was kept"
have "lnz$alive-h0" || fail "lnz$alive-h0 (pid $alive is alive) was removed"
have "loomkeep$$" || fail "loomkeep$$ (not a test's name) was removed"
grep -q "removed lnz$dead-h0, left by a run that was killed" <<<"$out" || fail "no line for lnz$dead-h0"
for _ in $(seq 100); do kill -0 "$inner" 2>/dev/null || break; sleep 0.05; done
kill -0 "$inner" 2>/dev/null && fail "the process in lnz$dead-h0 still runs"
echo "netns_lib_test: ok"
