#!/usr/bin/env bash
# End-to-end test of the benchmark programs: loom-bench's flags (--help exits 0, a bad flag
# exits 2), then every operation at 2 and 3 ranks over the tcp backend with -c 1 over every
# dtype and reduction (exit 0, no wrong element), and a smoke sweep of gloo_bench and mpi_bench
# when they were built. Usage: bench_programs_test.sh BIN_DIR
set -uo pipefail
bin=$1
# Each program run is bounded: 120 s, times the build's LOOM_TEST_TIMEOUT_SCALE (4 under TSan).
limit=$((120 * ${LOOM_TEST_TIMEOUT_SCALE:-1}))
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# This host's tuning cache (if someone ran loom-bench --tune) stays out of the test.
export LOOM_TUNING_CACHE=off

"$bin/loom-bench" --help >"$tmp/help" 2>&1 || fail "--help exited $?"
grep -q -- "--op" "$tmp/help" || fail "--help does not list --op"
for bad in "--op allreduse" "-b 1Q" "-b 16M -e 1M" "-d float128" "-o xor" "--bogus" \
  "--backend nope" "--algo nope" "-n 0" "-R 2" "--tune-max 1K" "--tune-max 2G"; do
  # shellcheck disable=SC2086
  "$bin/loom-bench" $bad >"$tmp/bad" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] || fail "loom-bench $bad exited $rc, expected 2"
  # The error first, naming the program, then where the flags are explained (not the whole help,
  # which would push the error off the screen).
  head -1 "$tmp/bad" | grep -q "^loom-bench: " || fail "loom-bench $bad: no error first: $(head -1 "$tmp/bad")"
  grep -q "Run 'loom-bench --help' for the flags" "$tmp/bad" || fail "loom-bench $bad: no pointer to --help"
done
grep -q "tune-max must be 4K to 1G per rank, got 2G" "$tmp/bad" ||
  fail "loom-bench --tune-max 2G: $(cat "$tmp/bad")"
# --tune with what it would ignore, or with a backend it cannot tune (the mpi backend crashed
# on its missing store), and --tune-max without --tune: refused, named.
while IFS='|' read -r args want; do
  # shellcheck disable=SC2086
  "$bin/loom-bench" $args >"$tmp/bad" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] || fail "loom-bench $args exited $rc, expected 2"
  grep -q -- "$want" "$tmp/bad" || fail "loom-bench $args: no '$want' in: $(head -n 3 "$tmp/bad")"
done <<'EOF'
--tune --op broadcast|--op has no effect with --tune
--tune -d half|--datatype has no effect with --tune
--tune -R 1|--register has no effect with --tune
--tune --backend mpi|--backend mpi has none to tune
--tune-max 1M|--tune-max has an effect only with --tune
EOF

# ranks N PROGRAM ARGS...: N ranks with torchrun's variables; rank 0's output in $tmp/out.
port=$((20000 + RANDOM % 10000))  # below the kernel's ephemeral range (32768-)
ranks() {
  # Another process may hold the port we picked: rank 0 then says "Address already in use", the
  # other ranks are stopped and we try the next port.
  local n=$1; shift
  local pids=() rc=0 attempt
  for attempt in 1 2 3 4 5; do
    port=$((port + 1))
    pids=() rc=0
    for ((r = 0; r < n; r++)); do
      if ((r == 0)); then out="$tmp/out"; else out="$tmp/out$r"; fi
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port LOOM_SHM=0 \
        timeout "$limit" "$@" >"$out" 2>&1 &
      pids+=($!)
    done
    wait "${pids[0]}" || rc=$?
    if grep -q "Address already in use" "$tmp/out"; then
      kill "${pids[@]:1}" 2>/dev/null
      for p in "${pids[@]:1}"; do wait "$p"; done
      continue
    fi
    for p in "${pids[@]:1}"; do wait "$p" || rc=$?; done
    break
  done
  return $rc
}

# A backend that is not available here exits 3 on every rank and says why (the GPU and RDMA
# runs themselves need the device: see pg_nccl_test and verbs_device_test).
if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  ranks 2 "$bin/loom-bench" --backend nccl -b 8 -e 1K
  rc=$?
  [[ $rc -eq 3 ]] || fail "loom-bench --backend nccl without a GPU exited $rc, expected 3"
  grep -qiE "no CUDA device|built without CUDA" "$tmp/out" ||
    fail "loom-bench --backend nccl without a GPU did not say why: $(tail -2 "$tmp/out")"
fi
if [[ -z $(ls /sys/class/infiniband 2>/dev/null) ]]; then
  ranks 2 "$bin/loom-bench" --backend verbs -b 8 -e 1K
  rc=$?
  [[ $rc -eq 3 ]] || fail "loom-bench --backend verbs without an RDMA device exited $rc, expected 3"
  grep -qiE "RDMA|verbs" "$tmp/out" ||
    fail "loom-bench --backend verbs without a device did not say why: $(tail -2 "$tmp/out")"
fi
# The device lines say what carries the data.
ranks 2 "$bin/loom-bench" -b 8 -e 8 -n 1 -w 0 || fail "loom-bench 8 bytes at 2 ranks failed: $(tail -n 5 "$tmp"/out*)"
grep -q "device  0 \[cpu\] loom tcp over tcp" "$tmp/out" ||
  fail "with LOOM_SHM=0 the device lines do not say tcp: $(grep device "$tmp/out")"

ops="all_reduce broadcast all_gather reduce_scatter reduce gather scatter alltoall barrier sendrecv"
for n in 2 3; do
  for op in $ops; do
    if ! ranks "$n" "$bin/loom-bench" --op "$op" -b 8 -e 8K -f 32 -n 2 -w 1 -c 1 -d all -o all \
      -r $((n - 1)); then
      fail "loom-bench --op $op at $n ranks exited non-zero"; tail -n 5 "$tmp"/out*
    fi
    grep -q "Out of bounds values : 0 OK" "$tmp/out" || fail "loom-bench --op $op at $n ranks: wrong elements"
  done
done

# Zero-copy windows (-R 1: the buffers are Loom windows) over shared memory, the window path
# forced from 1 byte: every op the window path runs, every dtype and reduction, at 2 and 3
# ranks (separate processes, so each rank maps its peers' windows). The others still run
# staged on window memory.
for n in 2 3; do
  for op in all_reduce broadcast all_gather reduce_scatter reduce alltoall; do
    if ! ranks "$n" env LOOM_SHM=1 LOOM_SHM_WINDOW_MIN_BYTES=1 "$bin/loom-bench" --op "$op" \
      -b 8 -e 1M -f 64 -n 2 -w 1 -c 1 -d all -o all -R 1 -r $((n - 1)); then
      fail "loom-bench -R 1 --op $op at $n ranks exited non-zero"; tail -n 5 "$tmp"/out*
    fi
    grep -q "Out of bounds values : 0 OK" "$tmp/out" ||
      fail "loom-bench -R 1 --op $op at $n ranks: wrong elements"
    grep -q "\[cpu, window\] loom tcp over shm" "$tmp/out" ||
      fail "loom-bench -R 1 --op $op: the device lines do not say window over shm: $(grep device "$tmp/out")"
  done
done
# --tune over shared memory writes this topology's section (with the single copy's sizes where
# it won here), and a sweep that loads the file gives no warning and no wrong element, on
# whichever path each size took.
tuning="$tmp/tuning.txt"
ranks 2 env LOOM_SHM=1 "$bin/loom-bench" --tune "$tuning" --tune-max 1M ||
  fail "loom-bench --tune exited non-zero: $(tail -n 3 "$tmp"/out*)"
grep -q "^\[world=2 per_host=2 transport=shm\]$" "$tuning" ||
  fail "loom-bench --tune wrote no shm section: $(cat "$tuning" 2>&1)"
grep -q "^allreduce.rd_max = " "$tuning" || fail "loom-bench --tune wrote no crossovers"
# tunedSweeps N SHM SWEEP...: every op at N ranks with LOOM_SHM=SHM and the tuned file: no
# wrong element, and no warning that the file was not taken.
tunedSweeps() {
  local n=$1 shm=$2 op
  shift 2
  for op in all_reduce broadcast all_gather reduce_scatter; do
    if ! ranks "$n" env LOOM_SHM="$shm" LOOM_TUNING_FILE="$tuning" "$bin/loom-bench" --op "$op" \
      "$@"; then
      fail "loom-bench --op $op (LOOM_SHM=$shm) with the tuned file exited non-zero"
      tail -n 5 "$tmp"/out*
    fi
    grep -q "Out of bounds values : 0 OK" "$tmp/out" ||
      fail "loom-bench --op $op (LOOM_SHM=$shm) with the tuned file: wrong elements"
    ! grep -q "LOOM_TUNING_FILE" "$tmp/out" ||
      fail "loom-bench --op $op: the tuned file was not taken: $(grep LOOM_TUNING_FILE "$tmp/out")"
  done
}
tunedSweeps 2 1 -b 8K -e 4M -f 8 -n 2 -w 1 -c 1 -d all -o all

# --tune over tcp at 3 ranks (where every operation has several algorithms) adds a tcp section
# to the same file, with a per-size rule for each of the four operations, and keeps the shm
# section; sweeps that load it take every size's rule without a wrong element.
ranks 3 env LOOM_SHM=0 "$bin/loom-bench" --tune "$tuning" --tune-max 256K ||
  fail "loom-bench --tune over tcp exited non-zero: $(tail -n 3 "$tmp"/out*)"
grep -q "^\[world=3 per_host=3 transport=tcp\]$" "$tuning" ||
  fail "loom-bench --tune wrote no tcp section: $(cat "$tuning")"
grep -q "^\[world=2 per_host=2 transport=shm\]$" "$tuning" ||
  fail "loom-bench --tune over tcp dropped the shm section: $(cat "$tuning")"
for op in allreduce broadcast allgather reduce_scatter; do
  grep -Eq "^$op\.rules = 0:[a-z]+( [0-9]+:[a-z]+)*$" "$tuning" ||
    fail "loom-bench --tune wrote no $op.rules: $(cat "$tuning")"
done
grep -q "^# broadcast: median us per call  tree  chain  direct  -> chosen$" "$tmp/out" ||
  fail "loom-bench --tune printed no broadcast sweep: $(head -n 20 "$tmp/out")"
grep -q "^#   262144 " "$tmp/out" && ! grep -q "^#   1048576 " "$tmp/out" ||
  fail "loom-bench --tune-max 256K did not stop at 256 KiB: $(head -n 20 "$tmp/out")"
tunedSweeps 3 0 -b 4K -e 64M -f 16 -n 1 -w 1 -c 1 -d float -o sum

# --tune without a file writes this host's tuning cache (LOOM_TUNING_CACHE's directory), and
# the next group reads it without being told, saying so in its group-ready line (about 2 s).
cache="$tmp/cache"
ranks 2 env LOOM_TUNING_CACHE="$cache" "$bin/loom-bench" --tune --tune-max 16K ||
  fail "loom-bench --tune (cache) exited non-zero: $(tail -n 3 "$tmp"/out*)"
cached=$(ls "$cache"/tuning-*.json 2>/dev/null | head -n 1)
[[ -n $cached ]] && grep -q '"world=2 per_host=2 transport=tcp"' "$cached" ||
  fail "loom-bench --tune wrote no cache section in $cache: $(ls "$cache" 2>&1; cat "$cached")"
grep -q "^# wrote $cached (this host's tuning cache" "$tmp/out" ||
  fail "loom-bench --tune did not name the cache: $(tail -n 8 "$tmp/out")"
ranks 2 env LOOM_TUNING_CACHE="$cache" LOOM_LOG_LEVEL=info "$bin/loom-bench" -b 8 -e 8 -n 1 -w 0 ||
  fail "loom-bench with the cache exited non-zero: $(tail -n 3 "$tmp/out")"
grep -q "ready over .*; tuning: cache $cached \[world=2 per_host=2 transport=tcp\]" "$tmp/out" ||
  fail "the group-ready line does not name the cache: $(grep ready "$tmp/out")"

ranks 2 "$bin/loom-bench" --backend nccl -R 1 -b 8 -e 8 >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "loom-bench -R 1 --backend nccl did not exit 2"

if [[ -x $bin/gloo_bench ]]; then
  for op in all_reduce all_gather reduce_scatter; do
    store=$(mktemp -d -p "$tmp")
    ranks 2 "$bin/gloo_bench" --store-dir "$store" --op "$op" -b 8 -e 8K -f 32 -n 2 -w 1 -c 1 \
      -d all -o all || fail "gloo_bench --op $op exited non-zero"
    grep -q "Out of bounds values : 0 OK" "$tmp/out" || fail "gloo_bench --op $op: wrong elements"
  done
fi
if [[ -x $bin/mpi_bench ]] && command -v mpirun >/dev/null; then
  root=(); [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
  for op in all_reduce reduce_scatter alltoall; do
    timeout "$limit" mpirun "${root[@]}" --oversubscribe -np 2 --mca btl self,vader "$bin/mpi_bench" \
      --op "$op" -b 8 -e 8K -f 32 -n 2 -w 1 -c 1 -d all -o all >"$tmp/out" 2>&1 ||
      fail "mpi_bench --op $op exited non-zero"
    grep -q "Out of bounds values : 0 OK" "$tmp/out" || fail "mpi_bench --op $op: wrong elements"
  done
fi

# README's own command: loom-bench over the mpi backend under mpirun, without MASTER_ADDR (no
# store the ranks share). It used to wait 30 s for a straggler exchange over the private stores
# and exit 3.
if [[ -x $bin/mpi_bench ]] && command -v mpirun >/dev/null; then  # MPI found: the backend is in
  root=(); [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
  env -u MASTER_ADDR -u MASTER_PORT timeout "$limit" mpirun "${root[@]}" --oversubscribe -np 2 \
    --mca btl self,vader "$bin/loom-bench" --backend mpi -b 8 -e 8K -f 32 -n 2 -w 1 \
    >"$tmp/out" 2>&1 || fail "mpirun loom-bench --backend mpi exited non-zero: $(tail -3 "$tmp/out")"
  grep -q "Out of bounds values : 0 OK" "$tmp/out" || fail "loom-bench --backend mpi: wrong elements"
  grep -q "# slowest rank: not measured: .*without one the ranks share" "$tmp/out" ||
    fail "loom-bench --backend mpi without a shared store did not say why no slowest rank"
fi

if ((failures)); then echo "$failures failure(s)"; exit 1; fi
echo "all benchmark program checks passed"
