#!/usr/bin/env bash
# README command (1): install what is missing, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
# Until loom-bench lands: processes rendezvous through a TCPStore.
build/bin/store_demo --nproc 4
