#!/usr/bin/env bash
# The README's test command: installs kvsim with its test extras, then runs the
# unit/property/validation/CLI suites in parallel and the end-to-end suites
# (headless Chromium, real llama-server) on their own, serially, afterwards —
# timings measured beside busy test workers would not be the engine's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q -e '.[dev,dask,calibrate]'

run_pytest() {
  set +e
  "$PY" -m pytest "$@"
  local rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests for: $*" >&2
    exit 1
  fi
  return "$rc"
}

run_pytest -q -n 2 -m "not e2e" tests
run_pytest -q -rPx -p no:xdist -m e2e tests
