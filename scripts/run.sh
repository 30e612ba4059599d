#!/usr/bin/env bash
# The main job: sets up, builds, starts the embedded single-node fluxond with its built-in config,
# prints its status and stops it cleanly.
# Usage: scripts/run.sh [--skip-deps] [--config FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_DEPS=0
CONFIG=()
while [ $# -gt 0 ]; do
  case $1 in
    --skip-deps) SKIP_DEPS=1 ;;
    --config) CONFIG=(--config "$2"); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ $SKIP_DEPS = 1 ] || bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target fluxond

LOG=$(mktemp /tmp/fluxond.XXXXXX.log)
build/src/fluxond "${CONFIG[@]}" >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q "^slots:" "$LOG" && break
  kill -0 $PID 2>/dev/null || { cat "$LOG"; echo "fluxond exited early" >&2; exit 1; }
  sleep 0.1
done
cat "$LOG"
kill -TERM $PID
wait $PID
echo "fluxond stopped cleanly (exit $?)"
