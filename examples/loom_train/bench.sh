#!/usr/bin/env bash
# Samples/s of loom-train and of PyTorch DDP (gloo) for 1, 2 and 4 ranks, MLP 784-1024-1024-10,
# batch 64 per rank, one thread per rank. Ranks are started with RANK / WORLD_SIZE /
# MASTER_ADDR / MASTER_PORT as loom-run would set them.
#   examples/loom_train/bench.sh [BUILD_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
STEPS=${2:-60}
PORT=$((29700 + RANDOM % 200))
for n in 1 2 4; do
  PORT=$((PORT + 1))
  pids=()
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT OMP_NUM_THREADS=1 \
      "$BUILD/bin/loom-train" --batch 64 --steps "$STEPS" > "/tmp/loom_train_bench_$r.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  tail -n 1 /tmp/loom_train_bench_0.out
done
for n in 1 2 4; do
  OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \
    /usr/bin/python3 examples/loom_train/torch_ddp_train.py --nproc "$n" --batch 64 \
    --steps "$STEPS" --port $((PORT + 10 + n))
done
