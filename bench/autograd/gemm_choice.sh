#!/usr/bin/env bash
# Builds gemm_choice.cc against the configured build's loom_autograd and OpenBLAS, then runs it
# at 1 and 2 threads, interleaved, ROUNDS times. Usage: bench/autograd/gemm_choice.sh [build] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
ROUNDS=${2:-3}
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread
LIB=$(find "$BUILD" -name 'libloom_autograd.a' | head -1)
[[ -n $LIB ]] || { echo "gemm_choice.sh: build loom_autograd in $BUILD first" >&2; exit 1; }
OUT=$BUILD/gemm_choice
g++ -std=c++20 -O2 -march=native -fopenmp -I autograd_lite/include -I /usr/include/eigen3 \
  -I /usr/include/x86_64-linux-gnu bench/autograd/gemm_choice.cc "$LIB" \
  "$OPENBLAS/libopenblas.so.0" -Wl,-rpath,$OPENBLAS -lpthread -o "$OUT"
for ((r = 1; r <= ROUNDS; r++)); do
  echo "== round $r ($(uptime | sed 's/.*load/load/'))"
  for t in 1 2; do OMP_WAIT_POLICY=passive "$OUT" $t; done
done
