#!/usr/bin/env bash
# A/B of two builds of Loom (two commits), interleaved: per round, per transport (shm; tcp with
# LOOM_SHM=0) and per size (8 B, 1 MiB, 64 MiB), 2-rank all-reduce from build A, then from build
# B; prints per cell the median over rounds of the in-place and out-of-place figures (time in
# µs at 8 B, busbw in GB/s above) with every round's in-place value.
#
# Usage: bench/peers/ab_commits.sh BUILD_DIR_A BUILD_DIR_B [ROUNDS]
#   e.g. git worktree add /tmp/base <commit> && (cd /tmp/base && scripts/build.sh)
#        bench/peers/ab_commits.sh /tmp/base/build build 5
set -euo pipefail
a=${1:?usage: ab_commits.sh BUILD_DIR_A BUILD_DIR_B [ROUNDS]}
b=${2:?usage: ab_commits.sh BUILD_DIR_A BUILD_DIR_B [ROUNDS]}
rounds=${3:-3}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for r in $(seq 1 "$rounds"); do
  for tr in shm tcp; do
    shm=1; [[ $tr == tcp ]] && shm=0
    for sz in "8 20000 1000" "1M 300 30" "64M 10 3"; do
      set -- $sz
      for who in A B; do
        dir=$a; [[ $who == B ]] && dir=$b
        line=$(LOOM_SHM=$shm "$dir/bin/loom-run" --nproc-per-node 2 "$dir/bin/loom-bench" \
          --op all_reduce -b "$1" -e "$1" -n "$2" -w "$3" 2>/dev/null | grep -E '^ +[0-9]' | tail -1)
        echo "$r $tr $1 $who $line" >> "$raw"
      done
    done
  done
done
python3 - "$raw" <<'PY'
import collections, statistics as st, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 17:
        continue
    tr, sz, who, v = f[1], f[2], f[3], f[4:]
    # nccl-tests columns: size count type redop root | time algbw busbw #wrong (out-of-place)
    # | time algbw busbw #wrong (in-place) | p50 p99 skew (oop) | p50 p99 skew (ip)
    d[(tr, sz, who)].append(dict(oop=float(v[5]), oopbw=float(v[7]), ip=float(v[9]),
                                 ipbw=float(v[11]), oop50=float(v[13]), ip50=float(v[16])))
print("| transport | size | figure | A | B | B/A |")
print("|---|---|---|---:|---:|---:|")
for tr in ("shm", "tcp"):
    for sz in ("8", "1M", "64M"):
        A, B = d[(tr, sz, "A")], d[(tr, sz, "B")]
        if not A or not B:
            continue
        keys = ([("ip50", "in-place p50 µs"), ("ip", "in-place mean µs"),
                 ("oop50", "out-of-place p50 µs")] if sz == "8" else
                [("ipbw", "in-place busbw GB/s"), ("oopbw", "out-of-place busbw GB/s")])
        for k, name in keys:
            ma, mb = st.median(x[k] for x in A), st.median(x[k] for x in B)
            print(f"| {tr} | {sz} | {name} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f} |")
        print(f"<!-- {tr} {sz} in-place per round: A {[x['ip'] for x in A]} B {[x['ip'] for x in B]} -->")
PY
