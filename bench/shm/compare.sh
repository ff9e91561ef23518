#!/usr/bin/env bash
# Side-by-side timing of one collective: Loom over shared memory, Loom over tcp (LOOM_SHM=0)
# and Open MPI with its shared-memory transport (vader), each repeated REPS times in
# alternation (the machine is shared: compare only within one run), best busbw / lowest
# median per size printed as a markdown table.
#
#   bench/shm/compare.sh [build-dir] [ranks] [op] [sizes] [reps]
#   bench/shm/compare.sh build-shm 2 allreduce 8,65536,1048576,16777216,67108864 3
#
# op: allreduce | broadcast | allgather. Builds loom_mpi_timing with mpicc when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
RANKS=${2:-2}
OP=${3:-allreduce}
SIZES=${4:-8,65536,1048576,16777216,67108864}
REPS=${5:-3}
SECONDS_PER_SIZE=${SECONDS_PER_SIZE:-0.3}
MPI_TIMEOUT=${MPI_TIMEOUT:-300}  # Open MPI can crawl on a loaded machine; what it printed is kept
MPI_BIN=$BUILD/bin/loom_mpi_timing
if [[ ! -x $MPI_BIN ]]; then mpicc -O2 -o "$MPI_BIN" bench/shm/mpi_timing.c; fi
MPI_OP=$OP
[[ $OP == broadcast ]] && MPI_OP=bcast
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 0; r < REPS; ++r)); do
  timeout 300 "$BUILD/bin/loom_comm_timing" --ranks "$RANKS" --op "$OP" --sizes "$SIZES" \
    --seconds "$SECONDS_PER_SIZE" | grep -v '^#' | tail -n +2 >>"$tmp/shm" || true
  LOOM_SHM=0 timeout 300 "$BUILD/bin/loom_comm_timing" --ranks "$RANKS" --op "$OP" \
    --sizes "$SIZES" --seconds "$SECONDS_PER_SIZE" | grep -v '^#' | tail -n +2 >>"$tmp/tcp" || true
  timeout "${MPI_TIMEOUT:-300}" mpirun --allow-run-as-root --oversubscribe -np "$RANKS" --mca btl vader,self \
    "$MPI_BIN" "$MPI_OP" "$SIZES" "$SECONDS_PER_SIZE" 2>/dev/null | grep -v '^#' >>"$tmp/mpi" || true
done
python3 - "$tmp" "$OP" "$RANKS" <<'PY'
import sys, collections
d, op, ranks = sys.argv[1:]
best = {}
for side in ("shm", "tcp", "mpi"):
    rows = collections.defaultdict(list)
    try:
        for line in open(f"{d}/{side}"):
            f = line.split()
            if len(f) >= 5:
                rows[int(f[0])].append((float(f[1]), float(f[4])))
    except FileNotFoundError:
        pass
    best[side] = {b: (min(m for m, _ in v), max(bw for _, bw in v)) for b, v in rows.items()}
sizes = sorted(set().union(*[set(v) for v in best.values()]))
print(f"{op}, {ranks} ranks: best of runs; median us (small) / busbw GB/s")
print("| bytes | loom shm | loom tcp | Open MPI shm | shm / MPI | shm / tcp |")
print("|---|---|---|---|---|---|")
for b in sizes:
    cells, ratio = [], []
    for side in ("shm", "tcp", "mpi"):
        v = best[side].get(b)
        if v is None:
            cells.append("—"); continue
        cells.append(f"{v[0]:.1f} us" if b < 1 << 20 else f"{v[1]:.2f} GB/s")
    def r(a, c):
        va, vc = best[a].get(b), best[c].get(b)
        if not va or not vc: return "—"
        return f"{vc[0]/va[0]:.2f}x" if b < 1 << 20 else (f"{va[1]/vc[1]:.2f}x" if vc[1] > 0 else "—")
    print(f"| {b} | " + " | ".join(cells) + f" | {r('shm','mpi')} | {r('shm','tcp')} |")
PY
