#!/usr/bin/env bash
# Runs loom-bench and its peers (Gloo over TCP; Open MPI over shared memory and over TCP) through
# the same sweep on this machine, in one run, then prints a Markdown table of busbw, time and
# ratios (Loom / peer) per operation and world size, and draws one SVG plot per pair.
# Loom runs twice: with LOOM_SHM=0 ("loom tcp", TCP compared with TCP: Gloo, Open MPI tcp) and
# with its shared-memory path ("loom shm", compared with Open MPI's shared-memory transport).
# Each round also measures the physical limits (bench/peers/tcp_baseline: loopback stream and
# round trip; bench/peers/shm_baseline: memcpy, process_vm_readv, flag round trip), and
# DIR/median.md puts every cell against Gloo, Open MPI and its limit
# (bench/peers/median_of_runs.py). The full table, as issue 19 asks for it:
#   scripts/peers.sh --rounds 3
#
# Usage: scripts/peers.sh [options]
#   --ops "all_reduce broadcast all_gather reduce_scatter"   operations (loom-bench --op names)
#   --ranks "2 4"                             world sizes
#   -b SIZE -e SIZE -f FACTOR                 sweep (default 8 .. 256M, factor 4)
#   -n ITERS -w WARMUP                        iterations per size (default 20, 5)
#   --small-iters N                           timed iterations per size below 64 KiB, where the
#                                             table prints p50 times (default 100: a p50 of 20
#                                             calls moved by up to 3x between rounds)
#   -d TYPE                                   data type (default float)
#   --quick                                   -e 16M -f 8 -n 5 --small-iters 20 -w 2 (a smoke run)
#   --out DIR                                 results folder (default bench-results/<date>)
#   --no-setup                                skip scripts/setup.sh --peers
#   --only "loom loom-shm gloo mpi"           which families to run (add loom-win: loom-bench -R 1
#                                             over shared memory, buffers in Loom windows, series
#                                             "loom shm window"; loom-tuned: shared memory with
#                                             the tuning file that `loom-bench --tune` measures
#                                             first, once per world size (DIR/tuning_n<N>.txt),
#                                             series "loom shm tuned"; both in compare_shm.md and
#                                             median.md; docs/shm.md, docs/bench.md; and
#                                             loom-tcp-tuned: LOOM_SHM=0 with the tuning file's
#                                             tcp section, tuned the same way, series "loom tcp
#                                             tuned", against Gloo and Open MPI tcp in median.md)
#   --rounds R                                run everything R times (default 1); round r starts
#                                             each cell at another family, and DIR/median.md holds
#                                             the median over rounds (bench/peers/median_of_runs.py)
#                                             with ratios and fractions of the limits
# Environment: LOOM_BUILD_DIR (default build).
# Output: DIR/csv/*.csv (one per run), DIR/logs/*.log (each run's nccl-tests table),
#         DIR/compare.md (raw TCP yardstick + in-place tables, ratios of loom tcp),
#         DIR/compare_shm.md (in place, median times, ratios of loom shm), DIR/compare_p50.md (the same
#         with median times), DIR/compare_out_of_place.md,
#         DIR/plot_<op>_n<ranks>.svg (in-place busbw), DIR/tcp_baseline.md, DIR/shm_baseline.md,
#         DIR/median.md (the full table: busbw, ratios, fractions of the limits).
#         With --rounds R > 1 each round writes all of that into DIR/round<r>/, and DIR/median.md
#         has, per size, the median busbw over the rounds and the median of each round's ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)

ops="all_reduce broadcast all_gather reduce_scatter"
ranks="2 4"
minb=8 maxb=256M factor=4 iters=20 small_iters=100 warmup=5 dtype=float
out="" setup=1 only="loom loom-shm gloo mpi" rounds=1
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --ops) ops=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    -b) minb=$2; shift 2 ;;
    -e) maxb=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --small-iters) small_iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    -d) dtype=$2; shift 2 ;;
    --quick) maxb=16M factor=8 iters=5 small_iters=20 warmup=2; shift ;;
    --out) out=$2; shift 2 ;;
    --no-setup) setup=0; shift ;;
    --only) only=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "peers.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
  echo "peers.sh: --rounds must be a positive integer, got '$rounds'" >&2; exit 2
fi
build=${LOOM_BUILD_DIR:-build}
out=${out:-bench-results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if ((setup)); then scripts/setup.sh --peers; fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${LOOM_BUILD_TYPE:-RelWithDebInfo} >/dev/null
targets=(loom-bench-compare)
known=$(cmake --build "$build" --target help)  # captured whole: grep -q would cut the pipe
for t in loom-bench loom-run gloo_bench mpi_bench tcp_baseline shm_baseline; do
  if grep -q "^$t:" <<<"$known"; then targets+=("$t"); fi
done
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
bin=$root_dir/$build/bin

sweep=(-b "$minb" -e "$maxb" -f "$factor" -n "$iters" --small-iters "$small_iters" -w "$warmup"
  -d "$dtype" -c 1)
mpi_root=()
if [[ $(id -u) -eq 0 ]]; then mpi_root=(--allow-run-as-root); fi
failures=0
port=$((29500 + RANDOM % 2000))

# run DIR NAME COMMAND...: runs one benchmark with a deadline, keeps its table in DIR/logs,
# counts failures.
run() {
  local dir=$1 name=$2; shift 2
  echo "== $name"
  if timeout 900 "$@" >"$dir/logs/$name.log" 2>&1; then
    grep -E "^# (Out of bounds|Avg bus)" "$dir/logs/$name.log" | sed 's/^/   /'
  else
    echo "   FAILED (exit $?), see $dir/logs/$name.log"; tail -5 "$dir/logs/$name.log" | sed 's/^/   /'
    failures=$((failures + 1))
  fi
}

# spawn N COMMAND...: starts N ranks with torchrun's variables (when loom-run is not built).
spawn() {
  local n=$1; shift
  local pids=() rc=0
  port=$((port + 1))
  for ((r = 0; r < n; r++)); do
    if ((r == 0)); then
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port "$@" &
    else
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port "$@" >/dev/null &
    fi
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

# The families of one (world size, operation) cell; run_family FAMILY N OP DIR runs one of them.
families=()
for f in loom loom-shm loom-win loom-tuned loom-tcp-tuned gloo mpi; do
  if [[ " $only " == *" $f "* ]]; then families+=("$f"); fi
done
run_family() {
  local family=$1 n=$2 op=$3 dir=$4
  local tag=${op}_n$n
  case "$family" in
    loom)
      [[ -x $bin/loom-bench ]] || return 0
      if [[ -x $bin/loom-run ]]; then
        # loom-run picks a free MASTER_PORT for the workers.
        run "$dir" "loom-tcp_$tag" env LOOM_SHM=0 "$bin/loom-run" --nproc-per-node "$n" \
          "$bin/loom-bench" --backend tcp --op "$op" "${sweep[@]}" \
          --series "loom tcp" --csv "$dir/csv/loom-tcp_$tag.csv"
      else
        run "$dir" "loom-tcp_$tag" env LOOM_SHM=0 bash -c "$(declare -f spawn); port=$port; spawn $n \
          '$bin/loom-bench' --backend tcp --op $op ${sweep[*]} --series 'loom tcp' \
          --csv '$dir/csv/loom-tcp_$tag.csv'"
        port=$((port + 1))
      fi ;;
    loom-shm)
      [[ -x $bin/loom-bench && -x $bin/loom-run ]] || return 0
      run "$dir" "loom-shm_$tag" env LOOM_SHM=1 "$bin/loom-run" --nproc-per-node "$n" \
        "$bin/loom-bench" --backend tcp --op "$op" "${sweep[@]}" \
        --series "loom shm" --csv "$dir/csv/loom-shm_$tag.csv" ;;
    loom-tuned)
      [[ -f $out/tuning_n$n.txt ]] && grep -q "transport=shm\]" "$out/tuning_n$n.txt" || return 0
      run "$dir" "loom-tuned_$tag" env LOOM_SHM=1 LOOM_TUNING_FILE="$out/tuning_n$n.txt" \
        "$bin/loom-run" --nproc-per-node "$n" "$bin/loom-bench" --backend tcp --op "$op" \
        "${sweep[@]}" --series "loom shm tuned" --csv "$dir/csv/loom-tuned_$tag.csv" ;;
    loom-tcp-tuned)
      [[ -f $out/tuning_n$n.txt ]] && grep -q "transport=tcp\]" "$out/tuning_n$n.txt" || return 0
      run "$dir" "loom-tcp-tuned_$tag" env LOOM_SHM=0 LOOM_TUNING_FILE="$out/tuning_n$n.txt" \
        "$bin/loom-run" --nproc-per-node "$n" "$bin/loom-bench" --backend tcp --op "$op" \
        "${sweep[@]}" --series "loom tcp tuned" --csv "$dir/csv/loom-tcp-tuned_$tag.csv" ;;
    loom-win)
      [[ -x $bin/loom-bench && -x $bin/loom-run ]] || return 0
      run "$dir" "loom-win_$tag" env LOOM_SHM=1 "$bin/loom-run" --nproc-per-node "$n" \
        "$bin/loom-bench" --backend tcp --op "$op" "${sweep[@]}" -R 1 \
        --series "loom shm window" --csv "$dir/csv/loom-win_$tag.csv" ;;
    gloo)
      [[ -x $bin/gloo_bench ]] || return 0
      local algos=ring algo series store
      if [[ $op == all_reduce ]]; then algos="ring bcube ring_chunked halving_doubling"; fi
      for algo in $algos; do
        series="gloo $algo"
        if [[ $op != all_reduce ]]; then series=gloo; fi
        store=$(mktemp -d)
        run "$dir" "gloo-${algo}_$tag" bash -c "$(declare -f spawn); port=$port; spawn $n \
          '$bin/gloo_bench' --algo $algo --store-dir '$store' --op $op ${sweep[*]} \
          --series '$series' --csv '$dir/csv/gloo-${algo}_$tag.csv'"
        rm -rf "$store"
      done ;;
    mpi)
      [[ -x $bin/mpi_bench ]] || return 0
      run "$dir" "mpi-shm_$tag" mpirun "${mpi_root[@]}" --oversubscribe -np "$n" --mca pml ob1 \
        --mca btl self,vader "$bin/mpi_bench" --op "$op" "${sweep[@]}" --series "mpi shm" \
        --csv "$dir/csv/mpi-shm_$tag.csv"
      run "$dir" "mpi-tcp_$tag" mpirun "${mpi_root[@]}" --oversubscribe -np "$n" --mca pml ob1 \
        --mca btl self,tcp --mca btl_tcp_if_include lo "$bin/mpi_bench" --op "$op" \
        "${sweep[@]}" --series "mpi tcp" --csv "$dir/csv/mpi-tcp_$tag.csv" ;;
  esac
}

# compare DIR: the tables and plots of one round's csv files.
compare() {
  local dir=$1 baseline=()
  ls "$dir"/csv/*.csv >/dev/null 2>&1 || return 0
  if ls "$dir"/csv/loom-tcp_*.csv >/dev/null 2>&1; then baseline=(--baseline "loom tcp"); fi
  # In place is the primary comparison: Loom's all_reduce/broadcast/reduce are in place only,
  # so their out-of-place columns include a copy the peers do not make (docs/bench.md).
  "$bin/loom-bench-compare" "${baseline[@]}" "$dir"/csv/*.csv >"$dir/compare_out_of_place.md"
  # The same with median times (robust against a busy machine's descheduling spikes).
  "$bin/loom-bench-compare" "${baseline[@]}" --in-place --stat p50 "$dir"/csv/*.csv \
    >"$dir/compare_p50.md"
  if ls "$dir"/csv/loom-shm_*.csv >/dev/null 2>&1; then
    # Shared memory against shared memory (and against Loom's own tcp), median times.
    "$bin/loom-bench-compare" --baseline "loom shm" --in-place --stat p50 "$dir"/csv/*.csv \
      >"$dir/compare_shm.md"
  fi
  {
    if [[ -f $dir/tcp_baseline.md ]]; then cat "$dir/tcp_baseline.md"; fi
    "$bin/loom-bench-compare" "${baseline[@]}" --in-place --plot-prefix "$dir/plot_" \
      "$dir"/csv/*.csv
  } >"$dir/compare.md"
}

# The tuned series' file: this machine's algorithm choices (and, over shared memory, single-copy
# ranges) per world size, measured once before the rounds with loom-bench --tune, one section
# per transport (shm for loom-tuned, tcp for loom-tcp-tuned) in DIR/tuning_n<N>.txt.
tune() {  # tune N SHM NAME
  local n=$1 shm=$2 name=$3
  mkdir -p "$out/logs"
  echo "== loom-bench --tune, $n ranks over $name"
  if ! timeout 900 env LOOM_SHM="$shm" "$bin/loom-run" --nproc-per-node "$n" "$bin/loom-bench" \
    --tune "$out/tuning_n$n.txt" >"$out/logs/tune_${name}_n$n.log" 2>&1; then
    echo "   FAILED, see $out/logs/tune_${name}_n$n.log: no tuned $name series at $n ranks"
    failures=$((failures + 1))
    return 1
  fi
}
if [[ -x $bin/loom-bench && -x $bin/loom-run ]]; then
  for n in $ranks; do
    if [[ " ${families[*]} " == *" loom-tuned "* ]]; then tune "$n" 1 shm || true; fi
    if [[ " ${families[*]} " == *" loom-tcp-tuned "* ]]; then tune "$n" 0 tcp || true; fi
  done
fi

# Round r runs every cell's families starting at family r (mod their number), so that no family
# always runs first or last in a cell when the machine drifts between minutes.
dirs=()
for ((r = 0; r < rounds; r++)); do
  dir=$out
  if ((rounds > 1)); then dir=$out/round$((r + 1)); echo "=== round $((r + 1)) of $rounds"; fi
  mkdir -p "$dir/csv" "$dir/logs"
  dirs+=("$dir")
  for n in $ranks; do
    for op in $ops; do
      for ((i = 0; i < ${#families[@]}; i++)); do
        run_family "${families[(i + r) % ${#families[@]}]}" "$n" "$op" "$dir"
      done
    done
  done
  # Raw loopback TCP, the yardstick of the tcp backend's targets (ping-pong and stream rate).
  if [[ -x $bin/tcp_baseline ]]; then
    echo "== raw loopback TCP"
    "$bin/tcp_baseline" >"$dir/tcp_baseline.md"
  fi
  # Memory: memcpy, cross-memory attach and the flag round trip, the shared-memory limits.
  if [[ -x $bin/shm_baseline ]]; then
    echo "== memory (memcpy, process_vm_readv, flag round trip)"
    "$bin/shm_baseline" >"$dir/shm_baseline.md"
  fi
  compare "$dir"
done
((rounds == 1)) && cat "$out/compare.md"
if ! bench/peers/median_of_runs.py "${dirs[@]}" >"$out/median.md"; then
  echo "peers.sh: median_of_runs.py failed" >&2
  failures=$((failures + 1))
fi
cat "$out/median.md"
for dir in "${dirs[@]}"; do cat "$dir/tcp_baseline.md" "$dir/shm_baseline.md" 2>/dev/null; done
echo
where=$out
echo "results: $out/median.md (the full table)"
if ((rounds > 1)); then where="$out/round1 .. round$rounds"; fi
echo "results: $where (compare.md = in place, compare_p50.md, compare_shm.md,"
echo "  compare_out_of_place.md, plot_*.svg, logs/, csv/)"
echo "$failures run(s) failed"
exit $((failures > 0))
