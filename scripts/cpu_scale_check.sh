#!/usr/bin/env bash
# The many-core check (issue 41), for a lent machine with many cores: the shared-memory
# all-reduce at 4, 8 and 16 ranks (default staged path, single copy forced on, Loom windows with
# and without --touch) beside torch's gloo and the memory limits measured in the same run, the
# reduce's window and staged paths at 8 ranks, and which BLAS kernel autograd_lite runs. Runs from the bundle scripts/gpu_check.sh prep makes (it
# carries loom-run, loom-bench, loom-memcpy-bound, loom-train and the torch references), so one
# device call runs both checks:
#
#   bash scripts/gpu_check.sh run; bash scripts/cpu_scale_check.sh run
#
#   scripts/cpu_scale_check.sh run [BUNDLE]   the checks below within CPU_CHECK_BUDGET_S (default
#                                             270 s), then a Markdown summary on stdout; logs in
#                                             $OUT/cpu_check_logs.tgz. RANKS="4 8 16" to change
#                                             the rank counts (capped at the cores).
# Each step has its own timeout and is skipped, saying so, when the budget is spent. The helpers
# column A/Bs the staged path with LOOM_SHM_COPY_THREADS=auto (floor(cores / n) - 1 helper
# threads per rank share its copies and folds; skipped where that is 0).
#
# Bounds (second table), all from memory rates measured in the same run (loom-memcpy-bound):
# - issue 41's own test: the staged path at >= 85% of 0.6·B·(n-1)/n, B one thread's memcpy of
#   64 MiB (docs/shm.md's count gives 4(n-1)B/(5n-1) ≈ 0.8·B·(n-1)/n for the same steps);
# - the same bounds with B_n(size), what each of n copiers gets when n copy buffers of that
#   size at once: the rate n ranks can have at the same time (a bound with one thread's B
#   assumes the machine gives every rank B at once, which 16 copiers on 16 cores do not get);
# - windows with --touch against the window all-reduce's 4(n-1)B/(3n-1) (issue: >= 60%).
# The last section says, per criterion, which cells pass. Exit status: 0 when every step ran, 1
# when one failed or a sum was wrong (a missed criterion is reported, not an error).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUDGET_S=${CPU_CHECK_BUDGET_S:-270}
START=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
declare -a ROWS=()
FAILED=0
# shellcheck source=scripts/lib/budgeted_step.sh
source "$ROOT/scripts/lib/budgeted_step.sh"

# step NAME LIMIT CMD...: CMD within the budget (10 s kept for the summary), its status a row.
step() {
  local name=$1
  budgeted_step "$1" "$2" 10 "${@:3}"
  local rc=$STEP_RC
  [ "$rc" -eq -1 ] && return 0
  if [ "$rc" -eq 0 ]; then
    ROWS+=("| $name | ok, ${STEP_TOOK} s |")
  else
    local why="timed out"
    [ "$rc" -eq 124 ] || why=$(tail -1 "$LOGS/$name.log" | cut -c1-120 | tr '|' '/')
    ROWS+=("| $name | **rc $rc** ($why), ${STEP_TOOK} s |")
    FAILED=1
  fi
}

# In-place busbw (nccl-tests column 12) of `size` in a loom-bench log; '-' when absent.
ip_busbw() { awk -v s="$2" '!/^#/ && $1 == s {print $12; f=1; exit} END {if (!f) print "-"}' "$1" 2>/dev/null || echo -; }
# The mean rate of `T` copiers copying `size` bytes each at once, from loom-memcpy-bound's
# concurrent table (| T | bytes | slowest | fastest | sum | mean |); empty when absent.
concurrent_mean() { awk -F'|' -v t="$2" -v s="$3" 'NF == 8 && $2 + 0 == t && $3 + 0 == s {gsub(/ /, "", $7); print $7; exit}' "$1" 2>/dev/null; }
# busbw (4th field) of `size` in a torch reference log.
torch_busbw() { awk -v s="$2" '!/^#/ && $1 == s {print $4; f=1; exit} END {if (!f) print "-"}' "$1" 2>/dev/null || echo -; }

run() {
  local bundle=${1:-}
  if [ -z "$bundle" ]; then
    bundle=$ROOT/build/gpu_bundle
    if [ ! -d "$bundle/bin" ] && [ -f "$ROOT/build/gpu_carry/gpu_bundle.tgz" ]; then
      bundle=/tmp/loom_gpu/gpu_bundle # where scripts/gpu_check.sh run unpacks the carried one
      [ -d "$bundle/bin" ] || { mkdir -p /tmp/loom_gpu && tar xzf "$ROOT/build/gpu_carry/gpu_bundle.tgz" -C /tmp/loom_gpu; }
    fi
  fi
  [ -x "$bundle/bin/loom-bench" ] || {
    echo "cpu_scale_check: no bundle at $bundle: run 'scripts/gpu_check.sh prep' and carry build/gpu_carry" >&2
    exit 1
  }
  local B=$bundle/bin
  LOGS=$(mktemp -d /tmp/cpu_check.XXXXXX)
  # torch runs with the machine's own library path; Loom's binaries with the bundle's first.
  local torch_env=(env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
  export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}
  export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
  local cores ranks=()
  cores=$(nproc)
  for n in ${RANKS:-4 8 16}; do [ "$n" -le "$cores" ] && ranks+=("$n"); done
  {
    lscpu | grep -E 'Model name|^CPU\(s\)|L2 cache|L3 cache|NUMA node\(s\)'
    echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}"
  } >"$LOGS/info.log" 2>&1

  local sizes="262144 1048576 4194304 16777216 67108864"
  # One thread per size, then T copiers at once per size for T = 1, 2, 4, .., the rank counts.
  local threads="1 2 4 8 16 $cores" tlist
  tlist=$(for t in $threads "${ranks[@]}"; do [ "$t" -le "$cores" ] && echo "$t"; done | sort -nu | paste -sd, -)
  step memcpy 90 "$B/loom-memcpy-bound" --seconds 0.12 --rounds 3 --threads "$tlist" \
    --concurrent-size "${sizes// /,}"
  # autograd_lite's BLAS: the kernel it reports, generic (OPENBLAS_CORETYPE=Prescott keeps what
  # was asked for) against what it picks itself (OPENBLAS_CORETYPE unset), and torch on one rank.
  local train=(env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 LOOM_AUTOGRAD_THREADS=1
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)
  step train_generic 60 "${train[@]}" MASTER_PORT=29811 OPENBLAS_CORETYPE=Prescott \
    "$B/loom-train" --model mlp --batch 64 --steps 40
  step train_auto 60 env -u OPENBLAS_CORETYPE "${train[@]}" MASTER_PORT=29812 \
    "$B/loom-train" --model mlp --batch 64 --steps 40
  step train_torch 90 "${torch_env[@]}" OMP_NUM_THREADS=1 python3 "$bundle/torch_ddp_train.py" --nproc 1 \
    --model mlp --batch 64 --steps 40 --port 29813

  local bench=("$B/loom-bench" -b 256K -e 64M -f 4 -n 20 -w 3 -c 1)
  # The helper-thread row runs fewer iterations, to stay within the budget.
  local bench_short=("$B/loom-bench" -b 256K -e 64M -f 4 -n 10 -w 2 -c 1)
  for n in "${ranks[@]}"; do
    step "staged_n$n" 60 "$B/loom-run" --nproc-per-node "$n" "${bench[@]}"
    step "single_copy_n$n" 60 env LOOM_SHM_SINGLE_COPY=on "$B/loom-run" --nproc-per-node "$n" "${bench[@]}"
    step "windows_n$n" 60 "$B/loom-run" --nproc-per-node "$n" "${bench[@]}" -R 1
    step "windows_touch_n$n" 60 "$B/loom-run" --nproc-per-node "$n" "${bench[@]}" -R 1 --touch
    # The fold's rotated reads (LOOM_SHM_FOLD_SKEW=1) against rank order, same bits either way.
    step "staged_skew_n$n" 60 env LOOM_SHM_FOLD_SKEW=1 "$B/loom-run" --nproc-per-node "$n" "${bench[@]}"
    # Helper threads for the staged copies (auto: floor(cores / n) - 1 per rank), where any.
    if [ $((cores / n - 1)) -ge 1 ]; then
      step "staged_helpers_n$n" 60 env LOOM_SHM_COPY_THREADS=auto "$B/loom-run" --nproc-per-node "$n" \
        "${bench_short[@]}"
    fi
  done
  for n in "${ranks[@]}"; do
    step "gloo_n$n" 90 "${torch_env[@]}" python3 "$bundle/nccl_ref.py" "$n" 256K,1M,4M,16M,64M --iters 10 \
      --backend gloo --port $((29700 + n))
  done
  # The reduce's window path against its staged one (the window reduce's 16 KiB crossover was
  # measured on 2 vCPUs only), at one rank count: 8 when there are 8 cores, else the largest.
  # Last, so that a short budget skips it before anything above.
  local rn=""
  for n in "${ranks[@]}"; do
    if [ -z "$rn" ] || [ "$n" -le 8 ]; then rn=$n; fi
  done
  local reduce_bench=("$B/loom-bench" --op reduce -b 4K -e 64M -f 4 -n 20 -w 3 -c 1)
  if [ -n "$rn" ]; then
    step "reduce_staged_n$rn" 60 "$B/loom-run" --nproc-per-node "$rn" "${reduce_bench[@]}"
    step "reduce_windows_n$rn" 60 "$B/loom-run" --nproc-per-node "$rn" "${reduce_bench[@]}" -R 1
    step "reduce_windows_touch_n$rn" 60 "$B/loom-run" --nproc-per-node "$rn" "${reduce_bench[@]}" -R 1 --touch
  fi
  local bw64
  bw64=$(awk -F'|' '$2 + 0 == 67108864 {gsub(/ /, "", $3); print $3; exit}' "$LOGS/memcpy.log")
  echo "## many-core check ($(($(date +%s) - START)) s of ${BUDGET_S} s)"
  echo
  sed 's/^/    /' "$LOGS/info.log"
  echo
  echo "| step | result |"
  echo "|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "### memory limits (loom-memcpy-bound)"
  echo
  grep -v '^#' "$LOGS/memcpy.log" 2>/dev/null
  echo
  echo "### all-reduce float sum, in place, busbw GB/s"
  echo
  echo "staged: the default path (ordinary buffers); single copy: LOOM_SHM_SINGLE_COPY=on;"
  echo "windows: -R 1 (Loom windows); touch: each rank rewrites its input before every iteration;"
  echo "gloo: torch's, p50. skew: the staged path with LOOM_SHM_FOLD_SKEW=1 (reads skewed and rotated"
  echo "per rank; the default reads in rank order). helpers (h): the staged path with"
  echo "LOOM_SHM_COPY_THREADS=auto, h = floor(${cores} cores / ranks) - 1 helper threads per rank (-n 10;"
  echo "'off' where h is 0)."
  echo
  echo "| ranks | bytes | staged | helpers (h) | skew | single copy | windows | windows touch | gloo |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  local n s
  for n in "${ranks[@]}"; do
    for s in $sizes; do
      local hp
      if [ $((cores / n - 1)) -ge 1 ]; then
        hp="$(ip_busbw "$LOGS/staged_helpers_n$n.log" "$s") ($((cores / n - 1)))"
      else
        hp="off (0)"
      fi
      echo "| $n | $s | $(ip_busbw "$LOGS/staged_n$n.log" "$s") | $hp |" \
        "$(ip_busbw "$LOGS/staged_skew_n$n.log" "$s") | $(ip_busbw "$LOGS/single_copy_n$n.log" "$s") |" \
        "$(ip_busbw "$LOGS/windows_n$n.log" "$s") | $(ip_busbw "$LOGS/windows_touch_n$n.log" "$s") |" \
        "$(torch_busbw "$LOGS/gloo_n$n.log" "$s") |"
    done
  done
  echo
  echo "### against the bounds"
  echo
  echo "B = ${bw64:-?} GB/s: one thread's memcpy of 64 MiB. B_n: what each of n copiers got, copying"
  echo "buffers of that size at once (memory table above). issue: 0.85 · 0.6·B·(n-1)/n, issue 41's test"
  echo "for the staged path. sbound: docs/shm.md's staged bound 4(n-1)X/(5n-1); wbound: the window"
  echo "all-reduce's 4(n-1)X/(3n-1); X = B or B_n as the column says. Percentages: the staged"
  echo "column (helpers: the helpers column) or windows touch over that bound."
  echo
  echo "| ranks | bytes | B_n | staged | issue | staged/sbound(B) | staged/sbound(B_n) | helpers | touch/wbound(B) | touch/wbound(B_n) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  local -a miss_staged=() miss_helpers=() miss_touch=() pass_staged=() pass_helpers=() pass_touch=()
  for n in "${ranks[@]}"; do
    for s in $sizes; do
      local st hp wt bn row
      st=$(ip_busbw "$LOGS/staged_n$n.log" "$s")
      hp=-
      [ $((cores / n - 1)) -ge 1 ] && hp=$(ip_busbw "$LOGS/staged_helpers_n$n.log" "$s")
      wt=$(ip_busbw "$LOGS/windows_touch_n$n.log" "$s")
      bn=$(concurrent_mean "$LOGS/memcpy.log" "$n" "$s")
      # One line of awk per cell: the bounds, the ratios and the verdicts (pass/miss/-).
      row=$(awk -v n="$n" -v b="${bw64:-0}" -v bn="$bn" -v st="$st" -v hp="$hp" -v wt="$wt" 'function pct(a, x) {
          return (x > 0 && a + 0 > 0) ? sprintf("%.0f%%", 100 * a / x) : "-" }
        function verdict(a, x) { return (x > 0 && a + 0 > 0) ? (a + 0 >= x ? "pass" : "miss") : "-" }
        BEGIN {
          issue = 0.85 * 0.6 * b * (n - 1) / n
          sb = 4 * (n - 1) * b / (5 * n - 1); sbn = 4 * (n - 1) * bn / (5 * n - 1)
          wb = 4 * (n - 1) * b / (3 * n - 1); wbn = 4 * (n - 1) * bn / (3 * n - 1)
          printf "%.2f|%s|%s|%s|%s|%s|%s|%s|%s", issue, pct(st, sb), pct(st, sbn), hp, pct(wt, wb), pct(wt, wbn),
            verdict(st, issue), verdict(hp, 10), verdict(wt, 0.6 * wb)
        }')
      IFS='|' read -r issue sb sbn hpc wb wbn v_st v_hp v_wt <<<"$row"
      echo "| $n | $s | ${bn:--} | $st | $issue | $sb | $sbn | $hpc | $wb | $wbn |"
      local cell="$n ranks $s B"
      if [ "$n" -ge 8 ]; then
        case $v_st in pass) pass_staged+=("$cell") ;; miss) miss_staged+=("$cell ($st < $issue)") ;; esac
      fi
      if [ "$n" -eq 8 ]; then
        case $v_hp in pass) pass_helpers+=("$cell") ;; miss) miss_helpers+=("$cell ($hp)") ;; esac
      fi
      case $v_wt in pass) pass_touch+=("$cell") ;; miss) miss_touch+=("$cell ($wb)") ;; esac
    done
  done
  echo
  echo "### issue 41's criteria on this machine"
  echo
  list() {
    if [ $# -eq 0 ]; then echo none; else
      local IFS=';' joined
      joined="$*"
      echo "${joined//;/; }"
    fi
  }
  echo "- staged >= 0.85 · 0.6·B·(n-1)/n at 8 and 16 ranks: ${#pass_staged[@]} cells pass; miss: $(list "${miss_staged[@]}")"
  echo "- helpers >= 10 GB/s at 8 ranks: ${#pass_helpers[@]} cells pass; miss: $(list "${miss_helpers[@]}")"
  echo "- windows --touch >= 60% of 4(n-1)B/(3n-1): ${#pass_touch[@]} cells pass; miss: $(list "${miss_touch[@]}")"
  echo
  if [ -n "$rn" ]; then
    echo "### reduce (root 0) float sum at $rn ranks, in place, busbw GB/s"
    echo
    echo "staged: ordinary buffers; windows: -R 1, from 16 KiB (LOOM_SHM_WINDOW_MIN_BYTES; below"
    echo "it the window buffers take the staged path too); touch: -R 1 --touch."
    echo
    echo "| bytes | staged | windows | windows touch |"
    echo "|---:|---:|---:|---:|"
    for s in 4096 16384 65536 262144 1048576 4194304 16777216 67108864; do
      echo "| $s | $(ip_busbw "$LOGS/reduce_staged_n$rn.log" "$s") |" \
        "$(ip_busbw "$LOGS/reduce_windows_n$rn.log" "$s") | $(ip_busbw "$LOGS/reduce_windows_touch_n$rn.log" "$s") |"
    done
    echo
  fi
  echo "#wrong over every loom-bench run (must be 0):"
  local wrong
  wrong=$(cat "$LOGS"/staged_*n*.log "$LOGS"/single_copy_n*.log "$LOGS"/windows*_n*.log \
    "$LOGS"/reduce_*_n*.log 2>/dev/null |
    awk '!/^#/ && NF >= 13 {w += $9 + $13} END {print w + 0}')
  echo "    $wrong"
  [ "${wrong:-0}" -eq 0 ] || FAILED=1
  echo
  echo "### autograd_lite's BLAS (loom-train mlp, batch 64, one rank, one thread)"
  echo
  for f in train_generic train_auto; do
    echo "- $f: $(grep -m1 -o 'matrix products on .*' "$LOGS/$f.log" | cut -c1-220);" \
      "$(grep -m1 -o '[0-9]* samples/s (steps after the first)' "$LOGS/$f.log")"
  done
  echo "- torch: $(grep -m1 -o '[0-9.]* samples/s' "$LOGS/train_torch.log")"
  tar czf "${OUT:-/tmp}/cpu_check_logs.tgz" -C "$LOGS" . 2>/dev/null
  echo
  echo "logs: ${OUT:-/tmp}/cpu_check_logs.tgz"
  return $FAILED
}

case ${1:-} in
  run) run "${2:-}" ;;
  *)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
