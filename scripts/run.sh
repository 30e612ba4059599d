#!/usr/bin/env bash
# The main job: sets up, builds, starts the embedded single-node fluxond (built-in config), runs a
# HiCache-like workload through the Python client (hit rate, pages/s, GB/s, p50/p99 of put and get
# batches), and stops the daemon.
# Usage: scripts/run.sh [--skip-deps] [--config FILE] [-- WORKLOAD ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_DEPS=0
CONFIG=()
while [ $# -gt 0 ]; do
  case $1 in
    --skip-deps) SKIP_DEPS=1 ;;
    --config) CONFIG=(--config "$2"); shift ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ $SKIP_DEPS = 1 ] || bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLUXON_PYTHON=ON \
  -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build -j "$(nproc)" --target fluxond _native

LOG=$(mktemp /tmp/fluxond.XXXXXX.log)
build/src/fluxond "${CONFIG[@]}" >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  grep -qx "fluxond .* ready" "$LOG" && break
  kill -0 $PID 2>/dev/null || { cat "$LOG"; echo "fluxond exited early" >&2; exit 1; }
  sleep 0.05
done
sed -n '/^fluxond .* ready$/,$p' "$LOG"
SOCKET=$(sed -n 's/^clients: socket //p' "$LOG")
PYTHONPATH=build/python python3 bench/hicache_workload.py --socket "$SOCKET" "$@"
kill -TERM $PID
wait $PID
echo "fluxond stopped cleanly"
