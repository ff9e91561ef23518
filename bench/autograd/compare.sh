#!/usr/bin/env bash
# Runs the autograd_lite MLP and GPT benchmarks and PyTorch's (OpenBLAS) side by side at 1 and 2
# threads, interleaved: each round runs loom then torch at 1 thread, then loom then torch at 2.
# At 2 threads torch also runs with OMP_WAIT_POLICY=PASSIVE (lines marked "passive"): its OpenMP
# workers otherwise spin after each parallel region and take the cores OpenBLAS's threads need,
# which on 2 cores costs it up to 5x; the fair torch figure is the better of the two.
# Usage: bench/autograd/compare.sh [build-dir] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
ROUNDS=${2:-3}
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [[ ! -e $OPENBLAS/libopenblas.so.0 ]]; then
  echo "compare.sh: $OPENBLAS missing; apt-get install libopenblas0-pthread (see ANCHORS.md)" >&2
  exit 1
fi
for ((r = 1; r <= ROUNDS; r++)); do
  for t in 1 2; do
    echo "== round $r, $t thread(s) ($(uptime | sed 's/.*load/load/'))"
    LOOM_AUTOGRAD_THREADS=$t "$BUILD/bin/autograd_mlp_bench" --benchmark_filter=Train 2>/dev/null |
      grep BM_
    policies=(ACTIVE)
    if ((t > 1)); then policies+=(PASSIVE); fi
    for opt in sgd adam; do
      for pol in "${policies[@]}"; do
        OMP_WAIT_POLICY=$pol OPENBLAS_NUM_THREADS=$t LD_LIBRARY_PATH=$OPENBLAS /usr/bin/python3 \
          bench/autograd/torch_mlp_bench.py --opt $opt --threads $t --seconds 2 --repeats 2 |
          sed "s/^torch/torch ${pol,,}/"
      done
    done
    LOOM_AUTOGRAD_THREADS=$t "$BUILD/bin/autograd_gpt_bench" 2>/dev/null | grep BM_
    for pol in "${policies[@]}"; do
      OMP_WAIT_POLICY=$pol OPENBLAS_NUM_THREADS=$t LD_LIBRARY_PATH=$OPENBLAS /usr/bin/python3 \
        bench/autograd/torch_gpt_bench.py --threads $t --seconds 3 --repeats 2 |
        sed "s/^torch/torch ${pol,,}/"
    done
  done
done
