#!/usr/bin/env bash
# Only the settings registry reads the process environment (common/src/settings.cc): every other
# file gets its values from Options, or from the registry's readers. Fails listing the offenders.
set -euo pipefail
src=${1:?usage: no_getenv_test.sh SOURCE_DIR}
cd "$src"
hits=$(grep -rnE '\b(secure_)?getenv\b|\benviron\b' \
  --include='*.cc' --include='*.h' --include='*.c' --include='*.cpp' --include='*.hpp' \
  common store comm process_group autograd_lite ddp tools bench examples tests python 2>/dev/null |
  grep -v '^common/src/settings.cc:' |
  grep -v '^common/include/loom/common/settings.h:' |
  grep -v '^tests/common/no_getenv_test.sh:' || true)
if [[ -n "$hits" ]]; then
  echo "environment read outside the settings registry (use loom::settings, declare the variable"
  echo "in common/src/settings_table.cc):"
  echo "$hits"
  exit 1
fi
echo "OK: only the settings registry reads the environment"
