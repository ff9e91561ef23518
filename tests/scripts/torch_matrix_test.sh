#!/usr/bin/env bash
# scripts/torch_matrix.sh without a network: wrong use exits 2 naming what was wrong, and a
# version that cannot be installed (a base python without pip) gets its summary line and exit 1
# without building anything.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tool=$root/scripts/torch_matrix.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

expect() {  # expect STATUS PATTERN ARGS...: the tool exits STATUS and prints PATTERN
  local want=$1 pattern=$2 rc=0
  shift 2
  LOOM_MATRIX_DIR=$tmp/matrix LOOM_PY_ENVS=$tmp/envs bash "$tool" "$@" >"$tmp/out" 2>&1 || rc=$?
  ((rc == want)) || fail "'$*' exited $rc, want $want: $(cat "$tmp/out")"
  grep -qE -- "$pattern" "$tmp/out" || fail "'$*' did not print '$pattern': $(cat "$tmp/out")"
}

expect 2 "usage: scripts/torch_matrix.sh"
expect 2 "unknown option '--keep'" --keep 2.4.1
expect 2 "'2.0.1' is not a torch 2.x version of the form 2.m.p with m >= 1" 2.0.1
expect 2 "'1.13.1' is not a torch 2.x version" 1.13.1
expect 2 "'2.11' is not a torch 2.x version" 2.11
expect 2 "'latest' is not a torch 2.x version" latest
# A base python without pip: scripts/setup_torch.sh exits 1 before reaching PyPI.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/python"
chmod +x "$tmp/bin/python"
LOOM_BASE_PYTHON=$tmp/bin/python expect 1 \
  "^2\.4\.1 +\? +not installed \(scripts/setup_torch\.sh exit 1\)" 2.4.1
grep -q "has no 'pip' module" "$tmp/out" || fail "setup_torch's reason is missing: $(cat "$tmp/out")"
[[ ! -e "$tmp/matrix/abi0" && ! -e "$tmp/matrix/abi1" ]] || fail "a build directory was made"
echo "torch_matrix_test: passed"
