#!/usr/bin/env bash
# README command (1): install what is missing, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/tests/common_test --gtest_brief=1
