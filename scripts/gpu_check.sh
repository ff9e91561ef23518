#!/usr/bin/env bash
# The nccl backend's GPU check (issue 39), for a lent GPU machine (one GPU, CUDA, NCCL and
# PyTorch 2.x in its python3, none of Loom's Debian dependencies, no registry). Started from
# ../shared/gpu/{prep.sh,gpu_checks.sh,torch_ref.py}.
#
#   scripts/gpu_check.sh prep [BUILD]   dev machine: builds the binaries below in BUILD (default
#                                       build/), copies them stripped into BUILD/gpu_bundle with
#                                       the shared libraries they need that a CUDA machine lacks,
#                                       then runs dry-run.
#   scripts/gpu_check.sh dry-run [B]    dev machine: checks the bundle B (default
#                                       build/gpu_bundle): every library a binary needs is either
#                                       carried, part of the base system, or CUDA / NCCL (found on
#                                       the GPU machine); and with LD_LIBRARY_PATH=B/lib ldd resolves
#                                       the carried ones there; its size fits a device call (64
#                                       MiB); the device-free tests run from the bundle; shellcheck.
#   scripts/gpu_check.sh run [B]        GPU machine: the checks below within 6 minutes, then a
#                                       Markdown summary on stdout; logs in $OUT/gpu_check_logs.tgz.
#
# prep also packs the bundle into BUILD/gpu_carry/gpu_bundle.tgz (a device call carries 64 MiB in
# all, and OpenBLAS alone is 36 MB unpacked). On the GPU machine (device tool): run with carry
# ["build/gpu_carry"] and the command
#   bash scripts/gpu_check.sh run
# which unpacks it into /tmp when build/gpu_bundle is not there.
# What run does, each step under its own timeout, skipped when the 6-minute budget is spent:
#   1. nccl_fake_test, nccl_watchdog_test (no device needed: the bundle works there);
#   2. pg_nccl_test (one rank) and nccl_ranks_test (2, 3, 4 ranks on the GPU, NCCL_HOSTID per
#      rank): every dtype and op against the closed form, ring exchanges, the caller's stream;
#   3. the bench table, all-reduce float sum, out of place: per-operation time at world size 1 and
#      2 of loom-bench --backend nccl, of NCCL called directly (loom-nccl-allreduce -s 1, each call
#      synchronized as loom-bench's and torch's are) and of torch's ProcessGroupNCCL
#      (bench/torch/nccl_ref.py), side by side, with the loom / direct busbw ratio from 1 MiB.
# Exit status: 0 when every step passed or skipped for a stated reason, 1 otherwise.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-}
BUDGET_S=${GPU_CHECK_BUDGET_S:-360}
# loom-memcpy-bound and loom-train are for scripts/cpu_scale_check.sh, which runs from this bundle.
BINARIES="tests/pg_nccl_test tests/nccl_ranks_test tests/nccl_fake_test tests/nccl_watchdog_test
bin/loom-bench bin/loom-run bin/loom-nccl-allreduce bin/loom-memcpy-bound bin/loom-train"
TARGETS="pg_nccl_test nccl_ranks_test nccl_fake_test nccl_watchdog_test loom-bench loom-run
loom-nccl-allreduce loom-memcpy-bound loom-train"
# Found on any machine (base system) or on the GPU machine (CUDA, NCCL): never carried.
NOT_CARRIED='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libcudart|libnccl|libcuda\.so'
MAX_BUNDLE_KB=$((60 * 1024))

die() {
  echo "gpu_check: $*" >&2
  exit 1
}

# The shared libraries `bin` needs (resolved paths) that a GPU machine lacks.
needed_libs() {
  ldd "$1" | awk '/=> \//{print $3}' | grep -Ev "$NOT_CARRIED" || true
}

prep() {
  local build=${1:-$ROOT/build}
  [ -f "$build/CMakeCache.txt" ] || die "no configured build in $build (scripts/build.sh or cmake -B)"
  grep -q '^LOOM_HAVE_NCCL:INTERNAL=ON' "$build/CMakeCache.txt" ||
    grep -q 'loom: NCCL backend ON' "$build/CMakeFiles/CMakeOutput.log" 2>/dev/null ||
    [ -f "$build/bin/loom-nccl-allreduce" ] ||
    echo "gpu_check: note: $build may be configured without NCCL; the build below will tell" >&2
  grep -q '^LOOM_PORTABLE:BOOL=ON' "$build/CMakeCache.txt" ||
    echo "gpu_check: note: $build is not configured with -DLOOM_PORTABLE=ON: autograd_lite (loom-train) is built for this CPU and may stop with SIGILL on the lent machine's" >&2
  # shellcheck disable=SC2086  # word splitting of the target list is wanted
  cmake --build "$build" -j"${JOBS:-2}" --target $TARGETS || die "build failed"
  local bundle=$build/gpu_bundle
  rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/lib"
  for b in $BINARIES; do
    [ -x "$build/$b" ] || die "missing $build/$b after the build"
    cp "$build/$b" "$bundle/bin/"
  done
  strip --strip-debug "$bundle"/bin/*
  cp "$ROOT/bench/torch/nccl_ref.py" "$ROOT/examples/loom_train/torch_ddp_train.py" "$bundle/"
  for f in "$bundle"/bin/*; do needed_libs "$f"; done | sort -u | while read -r lib; do
    cp -L "$lib" "$bundle/lib/"
  done
  strip --strip-debug "$bundle"/lib/* 2>/dev/null || true
  du -sh "$bundle" "$bundle/bin" "$bundle/lib"
  rm -rf "$build/gpu_carry" && mkdir -p "$build/gpu_carry"
  tar czf "$build/gpu_carry/gpu_bundle.tgz" -C "$build" gpu_bundle || die "packing the bundle failed"
  dry_run "$bundle"
}

# The bundle to run from: the folder given, build/gpu_bundle, or build/gpu_carry/gpu_bundle.tgz
# unpacked into /tmp (what a device call carries).
bundle_dir() {
  if [ -n "${1:-}" ]; then
    echo "$1"
  elif [ -d "$ROOT/build/gpu_bundle/bin" ]; then
    echo "$ROOT/build/gpu_bundle"
  elif [ -f "$ROOT/build/gpu_carry/gpu_bundle.tgz" ]; then
    [ -d /tmp/loom_gpu/gpu_bundle/bin ] ||
      { mkdir -p /tmp/loom_gpu && tar xzf "$ROOT/build/gpu_carry/gpu_bundle.tgz" -C /tmp/loom_gpu; } ||
      die "unpacking $ROOT/build/gpu_carry/gpu_bundle.tgz failed"
    echo /tmp/loom_gpu/gpu_bundle
  else
    echo "$ROOT/build/gpu_bundle"
  fi
}

dry_run() {
  local bundle=${1:-$ROOT/build/gpu_bundle}
  local bad=0
  [ -d "$bundle/bin" ] || die "no bundle at $bundle (run: scripts/gpu_check.sh prep)"
  for b in $BINARIES; do
    [ -x "$bundle/bin/$(basename "$b")" ] || { echo "MISSING binary $(basename "$b")"; bad=1; }
  done
  for f in "$bundle"/bin/*; do
    # Every library the binary needs that the GPU machine lacks is carried, and with the
    # bundle's lib/ first ldd resolves it there.
    while read -r lib; do
      local name
      name=$(basename "$lib")
      if [ ! -f "$bundle/lib/$name" ]; then
        echo "NOT CARRIED: $(basename "$f") needs $name"
        bad=1
      fi
    done < <(needed_libs "$f")
    while read -r line; do
      echo "NOT RESOLVED: $(basename "$f"): $line"
      bad=1
    done < <(LD_LIBRARY_PATH=$bundle/lib ldd "$f" | grep "not found" | grep -Ev "$NOT_CARRIED")
    while read -r name path; do
      case $path in
        "$bundle"/lib/*) ;;
        *)
          echo "RESOLVED OUTSIDE THE BUNDLE: $(basename "$f"): $name => $path"
          bad=1
          ;;
      esac
    done < <(LD_LIBRARY_PATH=$bundle/lib ldd "$f" | awk '/=> \//{print $1, $3}' |
      grep -Ev "$NOT_CARRIED")
  done
  local kb tree_kb packed=$bundle/../gpu_carry/gpu_bundle.tgz
  [ -f "$packed" ] || { echo "NOT PACKED: no $packed (run prep)"; bad=1; }
  kb=$(du -sk "$packed" 2>/dev/null | cut -f1)
  kb=${kb:-0}
  if [ "$kb" -gt "$MAX_BUNDLE_KB" ]; then
    echo "TOO BIG: $packed is $kb KiB (a device call carries 64 MiB in all)"
    bad=1
  fi
  # The working tree travels too: tree + bundle within the 64 MiB of a device call.
  tree_kb=$(cd "$ROOT" && git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  if [ $((kb + ${tree_kb:-0})) -gt $((64 * 1024)) ]; then
    echo "TOO BIG: bundle $kb KiB + working tree ${tree_kb} KiB exceed the 64 MiB a device call carries"
    bad=1
  fi
  # The device-free tests from the bundle itself (the stripped binaries and carried libraries).
  for t in nccl_fake_test nccl_watchdog_test; do
    if ! LD_LIBRARY_PATH=$bundle/lib timeout 120 "$bundle/bin/$t" >/tmp/gpu_check_$t.log 2>&1; then
      echo "FAILED from the bundle: $t (log /tmp/gpu_check_$t.log)"
      bad=1
    fi
  done
  # Without a device the GPU tests must skip (not fail) and the direct bench say so.
  if ! LD_LIBRARY_PATH=$bundle/lib timeout 60 "$bundle/bin/loom-nccl-allreduce" -b 8 -e 8 -n 1 \
    >/tmp/gpu_check_direct.log 2>&1; then
    echo "FAILED from the bundle: loom-nccl-allreduce (log /tmp/gpu_check_direct.log)"
    bad=1
  fi
  if command -v shellcheck >/dev/null; then
    shellcheck "$0" || bad=1
  else
    echo "note: shellcheck not installed; bash -n only"
  fi
  bash -n "$0" || bad=1
  python3 -m py_compile "$bundle/nccl_ref.py" || bad=1
  echo "bundle: $bundle, packed $kb KiB (+ working tree ${tree_kb:-?} KiB), $(find "$bundle/bin" -type f | wc -l) binaries, $(find "$bundle/lib" -type f | wc -l) libraries"
  if [ "$bad" -ne 0 ]; then
    echo "dry-run: FAILED"
    return 1
  fi
  echo "dry-run: OK"
}

# ---- run (GPU machine) ----

START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET_S - $(elapsed))); }
declare -a ROWS=()
FAILED=0
# shellcheck source=scripts/lib/budgeted_step.sh
source "$ROOT/scripts/lib/budgeted_step.sh"

# step NAME LIMIT CMD...: CMD within the budget (15 s kept for the summary), its verdict a row.
step() {
  local name=$1
  budgeted_step "$1" "$2" 15 "${@:3}"
  local rc=$STEP_RC
  [ "$rc" -eq -1 ] && return 0
  local verdict
  if [ "$rc" -eq 0 ] && grep -q '\[  SKIPPED \]\|# skipped' "$LOGS/$name.log"; then
    verdict="skipped ($(grep -m1 -o 'no CUDA device[^"]*' "$LOGS/$name.log" || echo see log))"
  elif [ "$rc" -eq 0 ]; then
    verdict="passed"
  elif [ "$rc" -eq 124 ]; then
    verdict="**timed out** after ${STEP_LIMIT} s"
    FAILED=1
  else
    local why
    why=$(grep -m1 -E 'Failure|FAILED|rror' "$LOGS/$name.log" || grep -v '^\s*$' "$LOGS/$name.log" | tail -1)
    verdict="**failed** (rc $rc): $(echo "$why" | cut -c1-160 | tr '|' '/')"
    FAILED=1
  fi
  ROWS+=("| $name | $verdict, ${STEP_TOOK} s |")
}

# Field `col` (1-based) of the out-of-place row of `size` in an nccl-tests style log.
col_of() {
  awk -v s="$2" -v c="$3" '!/^#/ && $1 == s {print $c; exit}' "$1" 2>/dev/null
}

run() {
  local bundle
  bundle=$(bundle_dir "${1:-}") || exit 1
  [ -d "$bundle/bin" ] || die "no bundle at $bundle: run 'scripts/gpu_check.sh prep' on the dev machine and carry build/gpu_carry"
  local B=$bundle/bin
  LOGS=$(mktemp -d /tmp/gpu_check.XXXXXX)
  libdir() { find /opt /usr/local /usr/lib -name "$1" 2>/dev/null | head -1 | xargs -r dirname; }
  local nccl_dir cudart_dir
  nccl_dir=$(libdir 'libnccl.so.2')
  cudart_dir=$(libdir 'libcudart.so.13')
  # torch runs with the machine's own library path (its wheel brings its NCCL and CUDA runtime;
  # the bundle's Debian libraries must not replace its Python's).
  local torch_env=(env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
  export LD_LIBRARY_PATH=$bundle/lib:${nccl_dir}:${cudart_dir}:${LD_LIBRARY_PATH:-}
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
  {
    nvidia-smi -L 2>&1 | head -2
    echo "cores: $(nproc); nccl: ${nccl_dir:-not found}; cudart: ${cudart_dir:-not found}"
    for f in "$B"/*; do ldd "$f" | grep "not found" | sed "s|^|MISSING for $(basename "$f"): |"; done
  } >"$LOGS/info.log" 2>&1

  step nccl_fake_test 60 "$B/nccl_fake_test"
  step nccl_watchdog_test 60 "$B/nccl_watchdog_test"
  step pg_nccl_test 90 "$B/pg_nccl_test"
  step nccl_ranks_test 150 "$B/nccl_ranks_test"

  # The bench table: float sum all-reduce, out of place.
  # The sizes of a -b 8 -e 64M -f 8 sweep.
  local sizes="8 64 512 4096 32768 262144 2097152 16777216"
  cat >"$LOGS/hostid.sh" <<EOF
#!/bin/sh
NCCL_HOSTID=loomhost\$RANK exec "\$@"
EOF
  chmod +x "$LOGS/hostid.sh"
  step loom_bench_w1 60 "$B/loom-run" --nproc-per-node 1 "$B/loom-bench" --backend nccl \
    -b 8 -e 64M -f 8 -n 50 -w 5 -c 1
  step direct_w1 45 "$B/loom-nccl-allreduce" -b 8 -e 64M -f 8 -n 50 -w 5 -c 1 -s 1
  step direct_w1_pipelined 45 "$B/loom-nccl-allreduce" -b 8 -e 64M -f 8 -n 50 -w 5 -c 0 -s 0
  step loom_bench_w2 60 "$B/loom-run" --nproc-per-node 2 "$LOGS/hostid.sh" "$B/loom-bench" \
    --backend nccl -b 8 -e 64M -f 8 -n 20 -w 3 -c 1
  step direct_w2 45 "$B/loom-run" --nproc-per-node 2 "$LOGS/hostid.sh" "$B/loom-nccl-allreduce" \
    -b 8 -e 64M -f 8 -n 20 -w 3 -c 1 -s 1
  local csv="8,64,512,4K,32K,256K,2M,16M"
  # Where the per-operation time goes: the blocking wait's steps on NCCL called directly (-s 2:
  # a blocking-sync event queried 50 us then synchronized; 3: and the caller-stream order before
  # the call; 4: 3 with a plain event queried until done), and loom with a longer spin.
  local s
  for s in 2 3 4; do
    step "direct_w1_s$s" 30 "$B/loom-nccl-allreduce" -b 8 -e 2M -f 8 -n 50 -w 5 -c 0 -s "$s"
  done
  step loom_bench_w1_spin2ms 40 env LOOM_NCCL_WAIT_SPIN_US=2000 "$B/loom-run" --nproc-per-node 1 \
    "$B/loom-bench" --backend nccl -b 8 -e 2M -f 8 -n 50 -w 5 -c 0
  step torch_w1 90 "${torch_env[@]}" python3 "$bundle/nccl_ref.py" 1 "$csv" --iters 50
  step torch_w2 90 "${torch_env[@]}" python3 "$bundle/nccl_ref.py" 2 "$csv" --iters 20

  echo "## nccl backend GPU check ($(elapsed) s of ${BUDGET_S} s)"
  echo
  sed 's/^/    /' "$LOGS/info.log"
  echo
  echo "| step | result |"
  echo "|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "### all-reduce float sum, out of place: time per operation (us), busbw (GB/s)"
  echo
  echo "loom (loom-bench --backend nccl) and direct (loom-nccl-allreduce -s 1): mean over the timed"
  echo "calls, each waited for on the host; torch: p50 of dist.all_reduce + torch.cuda.synchronize();"
  echo "pipelined: NCCL direct with the calls back to back (nccl-tests' way), for reference."
  echo
  echo "| bytes | loom w1 | direct w1 | torch w1 | pipelined w1 | loom w2 | direct w2 | torch w2 | loom/direct busbw w1 | w2 |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for s in $sizes; do
    local lw1 dw1 tw1 pw1 lw2 dw2 tw2 r1="" r2=""
    lw1=$(col_of "$LOGS/loom_bench_w1.log" "$s" 6)
    dw1=$(col_of "$LOGS/direct_w1.log" "$s" 6)
    tw1=$(col_of "$LOGS/torch_w1.log" "$s" 2)
    pw1=$(col_of "$LOGS/direct_w1_pipelined.log" "$s" 6)
    lw2=$(col_of "$LOGS/loom_bench_w2.log" "$s" 6)
    dw2=$(col_of "$LOGS/direct_w2.log" "$s" 6)
    tw2=$(col_of "$LOGS/torch_w2.log" "$s" 2)
    if [ "$s" -ge 1048576 ]; then
      r1=$(awk -v a="$(col_of "$LOGS/loom_bench_w1.log" "$s" 8)" \
        -v b="$(col_of "$LOGS/direct_w1.log" "$s" 8)" 'BEGIN{if (b > 0) printf "%.2f", a / b}')
      r2=$(awk -v a="$(col_of "$LOGS/loom_bench_w2.log" "$s" 8)" \
        -v b="$(col_of "$LOGS/direct_w2.log" "$s" 8)" 'BEGIN{if (b > 0) printf "%.2f", a / b}')
    fi
    echo "| $s | ${lw1:--} | ${dw1:--} | ${tw1:--} | ${pw1:--} | ${lw2:--} | ${dw2:--} | ${tw2:--} | ${r1:--} | ${r2:--} |"
  done
  echo
  echo "### where the per-operation time goes, world size 1, out of place (us)"
  echo
  echo "direct -s 1: cudaStreamSynchronize; -s 2: blocking-sync event, 50 us of queries, then"
  echo "cudaEventSynchronize (loom's host wait); -s 3: 2 after the caller-stream order (an event on"
  echo "the legacy default stream that the stream waits for); -s 4: 3 with a plain event queried"
  echo "until done; loom spin 2 ms: loom-bench with LOOM_NCCL_WAIT_SPIN_US=2000."
  echo
  echo "| bytes | direct -s 1 | -s 2 | -s 3 | -s 4 | loom | loom spin 2 ms | torch |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
  for s in 8 4096 262144 2097152; do
    echo "| $s | $(col_of "$LOGS/direct_w1.log" "$s" 6) | $(col_of "$LOGS/direct_w1_s2.log" "$s" 6) |" \
      "$(col_of "$LOGS/direct_w1_s3.log" "$s" 6) | $(col_of "$LOGS/direct_w1_s4.log" "$s" 6) |" \
      "$(col_of "$LOGS/loom_bench_w1.log" "$s" 6) | $(col_of "$LOGS/loom_bench_w1_spin2ms.log" "$s" 6) |" \
      "$(col_of "$LOGS/torch_w1.log" "$s" 2) |"
  done
  echo
  echo "#wrong (loom-bench and direct, every size, both placements) must be 0:"
  for f in loom_bench_w1 direct_w1 loom_bench_w2 direct_w2; do
    local wrong
    wrong=$(awk '!/^#/ && NF >= 13 {w += $9 + $13} END {print w + 0}' "$LOGS/$f.log" 2>/dev/null)
    echo "    $f: $wrong"
    [ "${wrong:-0}" -eq 0 ] || FAILED=1
  done
  tar czf "${OUT:-/tmp}/gpu_check_logs.tgz" -C "$LOGS" . 2>/dev/null
  echo
  echo "logs: ${OUT:-/tmp}/gpu_check_logs.tgz"
  return $FAILED
}

case $MODE in
  prep) prep "${2:-}" ;;
  dry-run) dry_run "${2:-}" ;;
  run) run "${2:-}" ;;
  *)
    sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
