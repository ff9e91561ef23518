#!/usr/bin/env bash
# Installs, only when missing, the Debian packages Loom builds and tests with.
# Safe to run repeatedly; runs `apt-get update` once before installing anything.
# Usage: scripts/setup.sh [--core | --peers]
#   --core   only what the libraries, loom-run and loom-bench need (scripts/run.sh)
#   --peers  everything, plus Gloo for bench/peers
set -euo pipefail

# What the libraries and programs need to build (the main job, scripts/run.sh).
core=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libssl-dev  # libcrypto: HMAC-SHA256 of the peers' authentication
)
packages=(
  "${core[@]}"
  libgtest-dev libgmock-dev libbenchmark-dev libibverbs-dev
  openmpi-bin libopenmpi-dev
  iproute2 procps
  python3-torch libtorch-dev pybind11-dev python3-pytest python3-numpy
  python3-venv python3-pip ca-certificates  # scripts/setup_torch.sh: torch 2.x's environment from PyPI
  libopenblas0-pthread  # torch's BLAS: the reference BLAS makes every torch comparison unfair
  fortunes python3-sklearn  # loom-train --model gpt's default text, --model cnn's digits
  clang libclang-rt-14-dev  # the fuzz targets (tests/fuzz): -fsanitize=fuzzer's runtime
)
case "${1:-}" in
  "") ;;
  --core) packages=("${core[@]}") ;;
  --peers) packages+=(libgloo-dev) ;;
  *)
    echo "setup: unknown option '$1' (expected --core, --peers or nothing)" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
