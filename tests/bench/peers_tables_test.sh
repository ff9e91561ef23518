#!/usr/bin/env bash
# bench/peers/median_of_runs.py and targets.py on a hand-made run of known figures: medians
# over rounds, the ratio columns, the "tcp of ring" yardstick (busbw over the ring's aggregate
# / n, n - 1 for broadcast), the counts of cells that meet issue 19's targets (the tuned tcp
# series counted in the best-of rows), and a table without the optional series.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# round R: loom tcp busbw at 1 MiB = 3.0 * R / 2 (1.5, 3.0, 4.5 -> median 3.0); the rest fixed.
for r in 1 2 3; do
  d=$tmp/round$r
  mkdir -p "$d"
  tcp=$(awk -v r=$r 'BEGIN { printf "%.3f", 1.5 * r }')
  {
    echo "### all_reduce, world size 2, float sum (in-place, p50 time; busbw GB/s / time us)"
    echo
    echo "| size | loom tcp | gloo ring | mpi tcp | loom shm | loom shm window | mpi shm | loom tcp tuned |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
    echo "| 8 B | 0.001 / 9.0 | 0.000 / 90.0 | 0.001 / 7.0 | 0.010 / 0.8 | 0.010 / 0.8 | 0.011 / 0.7 | 0.001 / 9.0 |"
    echo "| 1 MiB | $tcp / 350.0 | 1.000 / 1000.0 | 2.000 / 500.0 | 4.000 / 250.0 | 9.000 / 100.0 | 5.000 / 200.0 | 4.000 / 262.0 |"
    echo
    echo "### broadcast, world size 4, float sum (in-place, p50 time; busbw GB/s / time us)"
    echo
    echo "| size | loom tcp | gloo ring | mpi tcp | loom shm | loom shm window | mpi shm |"
    echo "|---:|---:|---:|---:|---:|---:|---:|"
    echo "| 4 MiB | 1.500 / 2800.0 | 0.500 / 8000.0 | 1.000 / 4000.0 | 3.000 / 1400.0 | 3.000 / 1400.0 | 1.000 / 4000.0 |"
  } >"$d/compare_p50.md"
  {
    echo "| ring of 2 streams, aggregate, blocking, 1 MiB buffers | 6.00 GB/s |"
    echo "| ring of 2 streams, aggregate, busy-polling, 1 MiB buffers | 5.00 GB/s |"
    echo "| ring of 4 streams, aggregate, blocking, 1 MiB buffers | 4.50 GB/s |"
    echo "| ring of 4 streams, aggregate, busy-polling, 1 MiB buffers | 4.00 GB/s |"
    echo "| one stream, 1 MiB writes, busy-polling | 5.00 GB/s |"
    echo "| 8-byte round trip, busy-polling reads (median / p99) | 9.0 / 12.0 us |"
  } >"$d/tcp_baseline.md"
done

python3 "$root/bench/peers/median_of_runs.py" "$tmp"/round{1,2,3} >"$tmp/median.md"
row() { grep -A6 "### $1" "$tmp/median.md" | grep "^| $2 |"; }
col() {  # TABLE SIZE COLUMN-NAME: the cell under that header
  local header line
  header=$(grep -A3 "### $1" "$tmp/median.md" | grep "^| size")
  line=$(row "$1" "$2")
  python3 - "$header" "$line" "$3" <<'PY'
import sys
h = [c.strip() for c in sys.argv[1].strip("|").split("|")]
v = [c.strip() for c in sys.argv[2].strip("|").split("|")]
print(v[h.index(sys.argv[3])])
PY
}
[[ $(col "all_reduce, world size 2" "1 MiB" "loom tcp") == "3.00 (1.50-4.50)" ]] ||
  fail "median of loom tcp: $(col "all_reduce, world size 2" "1 MiB" "loom tcp")"
# Ring of 2: the better of 6.00 and 5.00; all-reduce over 2 ranks: 3.0 / (6.0 / 2) = 1.00.
[[ $(col "all_reduce, world size 2" "1 MiB" "tcp of ring") == "1.00" ]] ||
  fail "tcp of ring, all-reduce: $(col "all_reduce, world size 2" "1 MiB" "tcp of ring")"
# Broadcast over 4 ranks: 1.5 / (4.5 / 3) = 1.00.
[[ $(col "broadcast, world size 4" "4 MiB" "tcp of ring") == "1.00" ]] ||
  fail "tcp of ring, broadcast: $(col "broadcast, world size 4" "4 MiB" "tcp of ring")"
[[ $(col "all_reduce, world size 2" "8 B" "tcp of ring") == "-" ]] || fail "tcp of ring below 64 KiB"
[[ $(col "all_reduce, world size 2" "1 MiB" "tcp / mpi tcp") == 1.50x* ]] ||
  fail "tcp / mpi tcp: $(col "all_reduce, world size 2" "1 MiB" "tcp / mpi tcp")"

python3 "$root/bench/peers/targets.py" "$tmp/median.md" >"$tmp/targets.txt"
# all-reduce 1 MiB: tcp 3.0 vs gloo 1.0 (met) and mpi 2.0 (1.50x, met); shm 4.0 vs 5.0 (staged
# 0.80x, missed), window 9.0 (met). Broadcast 4 MiB: tcp 3.0x gloo, 1.5x mpi; shm 3.0x.
# Columns: tcp vs gloo, the same with the tuned series, tcp vs mpi tcp, the same with the tuned
# series, shm staged, shm best of. The broadcast table has no tuned tcp series.
grep -q "^| all-reduce, 2 | 1 | 1 | 1 | 1 | 1 | 0 | 1 |$" "$tmp/targets.txt" || fail "all-reduce counts: $(cat "$tmp/targets.txt")"
grep -q "^| broadcast, 4 | 1 | 1 | 1 | 1 | 1 | 1 | 1 |$" "$tmp/targets.txt" || fail "broadcast counts"
grep -q "^- all-reduce, 2 ranks 1 MiB: 0.80x$" "$tmp/targets.txt" || fail "the staged miss"
grep -q "tuned÷mpi shm" "$tmp/targets.txt" || fail "the absent tuned series is not named"
# The 8-byte all-reduce latency target: tcp 9.0 us against Open MPI's 7.0 (0.78x), shm 0.8
# against 0.7 (0.88x): both below, each under its own heading.
grep -A1 "^Below '8 B tcp ≤ mpi tcp':" "$tmp/targets.txt" | grep -q "^- all-reduce, 2 ranks 8 B: 0.78x$" ||
  fail "the 8 B tcp miss: $(cat "$tmp/targets.txt")"
grep -A1 "^Below '8 B shm ≤ mpi shm':" "$tmp/targets.txt" | grep -q "^- all-reduce, 2 ranks 8 B: 0.8[78]x$" ||
  fail "the 8 B shm miss: $(cat "$tmp/targets.txt")"

# profile_cells.py takes the same misses: the 8 B cells (tcp and shm) and the staged 1 MiB
# cell, each two loom-bench runs at that size with its transport, the second with more calls
# (commands only: no perf here).
mkdir -p "$tmp/build/bin" && touch "$tmp/build/bin/loom-run" "$tmp/build/bin/loom-bench" &&
  chmod +x "$tmp/build/bin/"*
python3 "$root/bench/peers/profile_cells.py" "$tmp/median.md" --build "$tmp/build" --dry-run \
  >"$tmp/profile.txt"
[[ $(wc -l <"$tmp/profile.txt") == 6 ]] || fail "profile cells: $(cat "$tmp/profile.txt")"
grep -q "^LOOM_SHM=0 perf record .* --nproc-per-node 2 .* --op all_reduce -b 8 -e 8 " \
  "$tmp/profile.txt" || fail "the 8 B tcp profile: $(cat "$tmp/profile.txt")"
grep -q "^LOOM_SHM=1 perf record .* --op all_reduce -b 8 -e 8 " "$tmp/profile.txt" ||
  fail "the 8 B shm profile: $(cat "$tmp/profile.txt")"
grep -q "^LOOM_SHM=1 perf record .* --op all_reduce -b 1048576 -e 1048576 .* -c 0$" \
  "$tmp/profile.txt" || fail "the staged 1 MiB profile: $(cat "$tmp/profile.txt")"
python3 - "$root/bench/peers" <<'PY' || fail "profile_cells.py's classes"
import sys
sys.path.insert(0, sys.argv[1])
import profile_cells as p
cases = {
    "  25.61%  [kernel.kallsyms]  [k] _copy_from_iter": "socket copies",
    "   3.20%  libc.so.6  [.] __memmove_avx_unaligned_erms": "user copies",
    "   5.00%  loom-bench  [.] void loom::comm::avx2::plainKernel<float, loom::comm::Sum>(void*)":
        "reduction",
    "   1.00%  [kernel.kallsyms]  [k] pv_native_safe_halt": "idle",
    "   2.00%  loom-bench  [.] loom::shm::Arena::waitFor(int)": "waiting",
    "   1.00%  [kernel.kallsyms]  [k] tcp_sendmsg_locked": "tcp/ip",
    "   1.00%  [kernel.kallsyms]  [k] clear_page_erms": "page faults",
    "   1.00%  [kernel.kallsyms]  [k] __schedule": "scheduler",
    "   1.00%  [kernel.kallsyms]  [k] do_sys_poll": "syscalls, poll",
    "   1.00%  [kernel.kallsyms]  [k] some_new_function": "kernel other",
    "   1.00%  loom-bench  [.] loom::ProcessGroup::allreduce(x)": "loom other",
    "   1.00%  libstdc++.so.6  [.] operator new(unsigned long)": "other",
}
for line, want in cases.items():
    got = p.classify(line)[1]
    assert got == want, f"{line!r}: {got} (expected {want})"
assert p.classify("# comment") is None
assert p.short("void a::b<float, a::Sum>(int)") == "a::b<float, Sum>"
PY

# A TCP miss carries its ring figure: the same run with mpi tcp at 3.0 GB/s.
sed -i 's#| 2.000 / 500.0 |#| 3.000 / 350.0 |#' "$tmp"/round*/compare_p50.md
python3 "$root/bench/peers/median_of_runs.py" "$tmp"/round{1,2,3} >"$tmp/median.md"
python3 "$root/bench/peers/targets.py" "$tmp/median.md" >"$tmp/targets.txt"
grep -q "^- all-reduce, 2 ranks 1 MiB: 1.00x (loom tcp at 1.00 of the ring)$" "$tmp/targets.txt" ||
  fail "the tcp miss: $(grep "1 MiB" "$tmp/targets.txt")"
# The tuned series (4.0 GB/s) meets 1.2x mpi tcp there: 1.33x, counted in the best-of row only.
[[ $(col "all_reduce, world size 2" "1 MiB" "loom tcp tuned") == "4.00 (4.00-4.00)" ]] ||
  fail "loom tcp tuned: $(col "all_reduce, world size 2" "1 MiB" "loom tcp tuned")"
[[ $(col "all_reduce, world size 2" "1 MiB" "loom tcp tuned / mpi tcp") == 1.33x* ]] ||
  fail "tuned / mpi tcp: $(col "all_reduce, world size 2" "1 MiB" "loom tcp tuned / mpi tcp")"
grep -q "^| all-reduce, 2 | 1 | 1 | 1 | 0 | 1 | 0 | 1 |$" "$tmp/targets.txt" ||
  fail "all-reduce counts with the tuned series: $(cat "$tmp/targets.txt")"
# A run without Loom's shared-memory series (peers.sh --only "loom gloo mpi"): the shm targets
# print "-", not 0, and are named as missing.
mkdir -p "$tmp/tcponly"
{
  echo "### all_reduce, world size 2, float sum (in-place, p50 time; busbw GB/s / time us)"
  echo
  echo "| size | loom tcp | gloo ring | mpi tcp | mpi shm |"
  echo "|---:|---:|---:|---:|---:|"
  echo "| 1 MiB | 3.000 / 350.0 | 1.000 / 1000.0 | 2.000 / 500.0 | 5.000 / 200.0 |"
} >"$tmp/tcponly/compare_p50.md"
python3 "$root/bench/peers/median_of_runs.py" "$tmp/tcponly" >"$tmp/median.md"
python3 "$root/bench/peers/targets.py" "$tmp/median.md" >"$tmp/targets.txt"
grep -q "^| all-reduce, 2 | 1 | 1 | 1 | 1 | 1 | - | - |$" "$tmp/targets.txt" ||
  fail "counts without the shm series: $(cat "$tmp/targets.txt")"
grep -q "^| \*\*all\*\* | 1 | \*\*1\*\* | \*\*1\*\* | \*\*1\*\* | \*\*1\*\* | - | - |$" "$tmp/targets.txt" ||
  fail "totals without the shm series: $(cat "$tmp/targets.txt")"
grep -q "loom÷mpi shm" "$tmp/targets.txt" || fail "the missing shm series is not named"
shm_misses=$(awk "/^Below 'shm/ { f = 1; next } /^Below/ { f = 0 } f && /^- /" "$tmp/targets.txt")
[[ -z $shm_misses ]] || fail "misses listed for a series that did not run: $shm_misses"
echo "peers tables: ok"
