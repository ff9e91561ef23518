#!/usr/bin/env bash
# Samples/s of loom-train (gradient views and buckets in Loom windows, the default;
# --plain-buckets: buckets in ordinary memory; --copy-grads) and of PyTorch DDP
# (gloo, OpenBLAS) on the MLP 784-1024-1024-10, batch 64 per rank (MODEL mlp), or on the GPT of
# `loom-train --model gpt` (4 layers, 4 heads, width 128, context 128, batch 16 sequences per
# rank, AdamW; MODEL gpt), one thread per rank, interleaved: each round runs every configuration once per rank count, so that a change in
# machine load hits all of them alike. Ranks are started with RANK / WORLD_SIZE / MASTER_ADDR /
# MASTER_PORT as loom-run would set them. Prints one line per run:
#   round R ranks N loom|loom-plain|loom-copy|torch SAMPLES/S
#   examples/loom_train/bench.sh [BUILD_DIR] [STEPS] [ROUNDS] [RANK COUNTS, e.g. "1 2"] [MODEL]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
STEPS=${2:-60}
ROUNDS=${3:-3}
COUNTS=${4:-"1 2"}
MODEL=${5:-mlp}
case $MODEL in
  mlp) BATCH=64 EXTRA=() ;;
  gpt) BATCH=16 EXTRA=(--sample-chars 0) ;;
  *) echo "bench.sh: MODEL must be mlp or gpt, got '$MODEL'" >&2; exit 2 ;;
esac
PORT=$((29700 + RANDOM % 200))
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

loom() {  # ranks, extra flags...
  local n=$1
  shift
  PORT=$((PORT + 1))
  local pids=()
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT OMP_NUM_THREADS=1 \
      LOOM_AUTOGRAD_THREADS=1 timeout 300 "$BUILD/bin/loom-train" --model "$MODEL" \
      --batch "$BATCH" --steps "$STEPS" "${EXTRA[@]}" "$@" > "$OUT/rank$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  sed -n 's/.* \([0-9]*\) samples\/s (steps after the first)/\1/p' "$OUT/rank0"
}

torch_ddp() {  # ranks
  PORT=$((PORT + 1))
  OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \
    timeout 300 /usr/bin/python3 examples/loom_train/torch_ddp_train.py --nproc "$1" --model "$MODEL" \
    --batch "$BATCH" \
    --steps "$STEPS" --port "$PORT" | sed -n 's/.*, \([0-9]*\) samples\/s.*/\1/p'
}

for ((round = 1; round <= ROUNDS; round++)); do
  for n in $COUNTS; do
    echo "round $round ranks $n loom $(loom "$n")"
    echo "round $round ranks $n loom-plain $(loom "$n" --plain-buckets)"
    echo "round $round ranks $n loom-copy $(loom "$n" --copy-grads)"
    echo "round $round ranks $n torch $(torch_ddp "$n")"
  done
done
