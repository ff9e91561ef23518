#!/usr/bin/env bash
# README command (1): install what is missing, build, and run the main job: an all-reduce
# benchmark (nccl-tests format, every result checked) over 2 local ranks started by loom-run.
# Extra arguments go to loom-bench, e.g. scripts/run.sh --op all_gather -e 16M.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/bin/loom-run --nproc-per-node "${LOOM_NPROC:-2}" -- \
  build/bin/loom-bench --op all_reduce -b 16 -e 64M -f 4 -n 20 -w 5 -c 1 "$@"
