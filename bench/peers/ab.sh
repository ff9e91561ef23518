#!/usr/bin/env bash
# A/B comparison of loom-bench configurations on a noisy machine: runs every configuration once
# per round, rounds interleaved (so a slow minute of the machine hits all of them alike; each
# round starts at the next configuration), and prints per size the median in-place busbw over
# the rounds with every round's value (in the order the rounds ran). Give one configuration
# twice under two names (an A/A pair) to see how far apart the same code lands: on the 2-vCPU
# VMs 7 rounds of one configuration have differed by 10-20% at a size.
#
# Usage: bench/peers/ab.sh [options] CONFIG...
#   CONFIG   "NAME|VAR=VALUE ..."   loom-bench under loom-run with those environment variables
#                                   (LOOM_SHM=0 unless the config sets LOOM_SHM); words that
#                                   start with '-' are loom-bench flags ("win|LOOM_SHM=1 -R 1");
#                                   LOOM_BUILD_DIR=DIR runs that build's loom-run and loom-bench
#                                   (A/B against another worktree)
#            "mpi-tcp" / "mpi-shm"  Open MPI's mpi_bench over TCP / shared memory, as peers.sh
#            "gloo-ALGO"            Gloo's gloo_bench --algo ALGO over its TCP transport (ring,
#                                   ring_chunked, halving_doubling, bcube; ring for other ops)
#   --op OP            loom-bench --op (default all_reduce)
#   --ranks N          world size (default 2)
#   --rounds N         rounds (default 3)
#   -b SIZE -e SIZE -f FACTOR -n ITERS -w WARMUP   sweep (default 1M 64M 4 20 5)
#   --time             print the in-place time (us, mean over the iterations) instead of busbw
#   --touch            every bench rewrites its input before each iteration (--touch, untimed)
#   --touch-values V   what --touch writes: zeros (default) or gradients (loom-bench --help)
# Example: bench/peers/ab.sh --ranks 4 "ring|LOOM_ALGO=ring" "hd|LOOM_ALGO=hd" mpi-tcp
#          bench/peers/ab.sh --rounds 5 loom gloo-ring gloo-ring_chunked gloo-halving_doubling
# Environment: LOOM_BUILD_DIR (default build). Builds nothing: run scripts/peers.sh or build first.
set -euo pipefail
cd "$(dirname "$0")/../.."

op=all_reduce ranks=2 rounds=3 minb=1M maxb=64M factor=4 iters=20 warmup=5 column=12 touch=() touchValues=""
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
configs=()
while (($#)); do
  case "$1" in
    --op) op=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -b) minb=$2; shift 2 ;;
    -e) maxb=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    --time) column=10; shift ;;
    --touch) touch=(--touch); shift ;;
    --touch-values) touchValues=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "ab.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) configs+=("$1"); shift ;;
  esac
done
if ((${#configs[@]} == 0)); then
  echo "ab.sh: no configuration given" >&2; usage >&2; exit 2
fi
bin=${LOOM_BUILD_DIR:-build}/bin
for b in loom-bench loom-run; do
  [[ -x $bin/$b ]] || { echo "ab.sh: $bin/$b is not built" >&2; exit 2; }
done
mpi_root=()
if [[ $(id -u) -eq 0 ]]; then mpi_root=(--allow-run-as-root); fi
if [[ -n $touchValues ]]; then
  ((${#touch[@]})) || { echo "ab.sh: --touch-values needs --touch" >&2; exit 2; }
  touch+=(--touch-values "$touchValues")
fi
sweep=(--op "$op" -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" -c 1 "${touch[@]}")

results=$(mktemp)
trap 'rm -f "$results"' EXIT
# run CONFIG: one loom-bench (or mpi_bench) run; appends "name size busbw" lines.
run() {
  local cfg=$1 name out
  name=${cfg%%|*}
  case "$cfg" in
    mpi-tcp|mpi-shm)
      local btl=(--mca btl self,vader)
      [[ $cfg == mpi-tcp ]] && btl=(--mca btl self,tcp --mca btl_tcp_if_include lo)
      out=$(timeout 900 mpirun "${mpi_root[@]}" --oversubscribe -np "$ranks" --mca pml ob1 \
        "${btl[@]}" "$bin/mpi_bench" "${sweep[@]}" 2>&1) ;;
    gloo-*)
      [[ -x $bin/gloo_bench ]] || { echo "ab.sh: $bin/gloo_bench is not built" >&2; exit 2; }
      local store
      store=$(mktemp -d)
      out=$(timeout 900 "$bin/loom-run" --nproc-per-node "$ranks" "$bin/gloo_bench" \
        --algo "${cfg#gloo-}" --store-dir "$store" "${sweep[@]}" 2>&1)
      local rc=$?
      rm -rf "$store"
      ((rc == 0)) ;;
    *)
      local words=() envs=() flags=() w
      [[ $cfg == *"|"* ]] && read -r -a words <<<"${cfg#*|}"
      for w in "${words[@]}"; do
        if [[ $w == -* || ${#flags[@]} -gt 0 ]]; then flags+=("$w"); else envs+=("$w"); fi
      done
      local cbin=$bin
      for w in "${envs[@]}"; do [[ $w == LOOM_BUILD_DIR=* ]] && cbin=${w#LOOM_BUILD_DIR=}/bin; done
      out=$(env LOOM_SHM=0 "${envs[@]}" timeout 900 "$cbin/loom-run" --nproc-per-node "$ranks" \
        "$cbin/loom-bench" --backend tcp "${sweep[@]}" "${flags[@]}" 2>&1) ;;
  esac || { echo "ab.sh: $name failed:" >&2; tail -5 <<<"$out" >&2; exit 1; }
  if ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
    echo "ab.sh: $name reported wrong elements" >&2; exit 1
  fi
  # nccl-tests rows: column 1 size, column 10 in-place time, column 12 in-place busbw.
  awk -v n="$name" -v c="$column" '/^ +[0-9]/ {print n, $1, $c}' <<<"$out" >>"$results"
}

# Round r starts at configuration r (mod their number): no configuration always runs first (after
# the previous round's last) or last, where the machine's state would favour it every round.
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < ${#configs[@]}; i++)); do run "${configs[(i + r) % ${#configs[@]}]}"; done
done

what="busbw GB/s"
((column == 10)) && what="time us"
echo "# $op, $ranks ranks, in-place $what${touch:+ (inputs rewritten before each iteration)}: median of $rounds interleaved rounds [each round]"
for cfg in "${configs[@]}"; do
  name=${cfg%%|*}
  line="$name:"
  for size in $(awk -v n="$name" '$1 == n {print $2}' "$results" | sort -n -u); do
    values=$(awk -v n="$name" -v s="$size" '$1 == n && $2 == s {print $3}' "$results")
    median=$(sort -g <<<"$values" | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    line+="  $size=$median [$(tr '\n' ' ' <<<"$values" | sed 's/ $//')]"
  done
  echo "$line"
done
