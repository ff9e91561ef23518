# shellcheck shell=bash
# Sourced by scripts/gpu_check.sh and scripts/cpu_scale_check.sh: one step of a check that runs
# within a time budget. The caller defines left() (seconds of the budget left), BUDGET_S, LOGS
# and the array ROWS (the summary table's rows).
#
# budgeted_step NAME LIMIT RESERVE CMD...
#   Runs CMD under `timeout`, stdout and stderr in $LOGS/NAME.log, for at most LIMIT seconds and
#   at most what is left of the budget less RESERVE (the seconds the caller keeps for its
#   summary). Sets STEP_RC (CMD's exit status, 124 when it timed out; -1 when it did not run
#   because fewer than 10 seconds were left, which adds a "skipped" row), STEP_TOOK (seconds)
#   and STEP_LIMIT (the timeout it ran under).
# shellcheck disable=SC2034 # STEP_RC, STEP_TOOK and STEP_LIMIT are its results
budgeted_step() {
  local name=$1 limit=$2 reserve=$3
  shift 3
  local remaining
  remaining=$(($(left) - reserve))
  STEP_TOOK=0
  STEP_LIMIT=0
  if [ "$remaining" -lt 10 ]; then
    ROWS+=("| $name | skipped: the ${BUDGET_S} s budget is spent |")
    STEP_RC=-1
    return 0
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  STEP_LIMIT=$limit
  local t0
  t0=$(date +%s)
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  STEP_RC=$?
  STEP_TOOK=$(($(date +%s) - t0))
}
