#!/usr/bin/env bash
# Checks fluxond's /metrics pages and the Grafana dashboard against a real cluster on loopback:
#   1. starts a master and two owners (TCP data planes), each with its own metrics port, in a
#      temporary directory,
#   2. drives a little traffic with the Python client: a put on owner 1, a get of the same keys
#      on owner 2 (a remote get, so the remote-get counters and the per-source read histogram
#      have samples), a local get again on owner 2, one miss and one delete,
#   3. scrapes /metrics of every process and checks each page with `promtool check metrics`,
#   4. checks that every metric the dashboard (configs/grafana/fluxon-dashboard.json) queries is
#      on at least one of the pages, and that promtool parses every one of its expressions
#      (scripts/check-dashboard-metrics.py).
# Every process is stopped on exit; every wait is bounded.
# Usage: scripts/check-metrics.sh [BUILD_DIR]   (default build)
# Environment: FLUXOND (default BUILD_DIR/src/fluxond); PYTHON (default python3), the interpreter
# of the client: when it cannot import fluxon, BUILD_DIR/python is put on PYTHONPATH; PROMTOOL
# (default promtool from PATH); SCRAPES_DIR: when set, the scraped pages are copied there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${1:-build}
FLUXOND=${FLUXOND:-$ROOT/$BUILD/src/fluxond}
PYTHON=${PYTHON:-python3}
DASHBOARD=configs/grafana/fluxon-dashboard.json
PROMTOOL=${PROMTOOL:-$(command -v promtool || true)}
[ -x "$FLUXOND" ] || { echo "check-metrics: no fluxond at $FLUXOND" >&2; exit 1; }
[ -n "$PROMTOOL" ] || { echo "check-metrics: promtool not found (Debian package prometheus)" >&2; exit 1; }
if ! "$PYTHON" -c "import fluxon" 2>/dev/null; then
  export PYTHONPATH="$ROOT/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
fi

WORK=$(mktemp -d /tmp/fluxon-metrics.XXXXXX)  # short: it holds the client sockets
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ $rc -ne 0 ]; then
    for log in "$WORK"/*.log; do [ -f "$log" ] && { echo "--- $log"; tail -n 30 "$log"; }; done
  fi
  if [ -n "${SCRAPES_DIR:-}" ]; then
    mkdir -p "$SCRAPES_DIR"
    cp "$WORK"/*.prom "$SCRAPES_DIR"/ 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free loopback ports, all picked at once so that none is handed out twice.
read -r MASTER_PORT MASTER_ADMIN MASTER_METRICS ADMIN1 METRICS1 ADMIN2 METRICS2 < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
for s in socks: s.close()')

# start NAME CONFIG_TEXT: starts one fluxond and waits (bounded) until it logs "ready".
start() {
  local name=$1
  printf '%s\n' "$2" > "$WORK/$name.yaml"
  "$FLUXOND" --config "$WORK/$name.yaml" > "$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  local pid=$!
  for _ in $(seq 200); do
    grep -qw ready "$WORK/$name.log" && return 0
    kill -0 "$pid" 2>/dev/null || { echo "check-metrics: $name exited" >&2; return 1; }
    sleep 0.1
  done
  echo "check-metrics: $name not ready after 20 s" >&2
  return 1
}

start master "role: master
log_level: warn
master: {listen_address: \"127.0.0.1:$MASTER_PORT\", owner_lease_ms: 5000}
admin: {listen_address: \"127.0.0.1:$MASTER_ADMIN\", metrics_address: \"127.0.0.1\", metrics_port: $MASTER_METRICS}"
owner() {  # owner NODE_ID ADMIN_PORT METRICS_PORT
  start "owner-$1" "role: owner
node_id: $1
log_level: warn
admin: {listen_address: \"127.0.0.1:$2\", metrics_address: \"127.0.0.1\", metrics_port: $3}
owner:
  master_address: \"127.0.0.1:$MASTER_PORT\"
  socket_path: $WORK/owner-$1.sock
  segment: {size: 1GiB}
  heartbeat_interval_ms: 200
  data_address: \"127.0.0.1:0\"
  transports: [tcp]
  remote_get_timeout_ms: 5000"
}
owner 1 "$ADMIN1" "$METRICS1"
owner 2 "$ADMIN2" "$METRICS2"

echo "[check-metrics] traffic: put on owner 1, remote get on owner 2, a miss, a delete"
timeout 60 "$PYTHON" - "$WORK/owner-1.sock" "$WORK/owner-2.sock" <<'PY'
import sys
import numpy as np
import fluxon

VALUE_LEN = 64 * 1024
a, b = fluxon.KvClient(socket_path=sys.argv[1]), fluxon.KvClient(socket_path=sys.argv[2])
keys = [f"metrics-{i}" for i in range(8)]
plan = a.local_fast_put_start(keys, VALUE_LEN)
src = np.arange(len(keys) * VALUE_LEN, dtype=np.uint32).astype(np.uint8)
fluxon.copy_to_plan(plan, src.ctypes.data, VALUE_LEN)
a.local_fast_put_commit(plan).wait(10)


def get(client, ks):
    h = client.get_start(ks)
    n = h.result.transferable_len
    if n == 0:
        client.cancel_get_transfer(h)
        return 0, None
    plan = client.get_transfer(h)
    out = np.zeros(n * VALUE_LEN, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, VALUE_LEN)
    client.release_views(plan)
    return n, out


for round_ in range(2):  # remote the first time, a local hit of the cached copy the second
    n, out = get(b, keys)
    assert n == len(keys) and (out == src).all(), f"round {round_}: {n} of {len(keys)} pages"
assert get(b, ["metrics-missing"])[0] == 0
deleted, kept = a.delete_prefix("metrics-7")
assert deleted == 1 and kept == 0, (deleted, kept)
s = b.stats()
assert s["remote_hits"] == len(keys) and s["misses"] >= 1, s
PY

fail=0
scrapes=()
for target in master:"$MASTER_METRICS" owner-1:"$METRICS1" owner-2:"$METRICS2"; do
  name=${target%%:*}
  port=${target#*:}
  out="$WORK/$name.prom"
  curl -fsS --max-time 10 --retry 3 --retry-connrefused -o "$out" "http://127.0.0.1:$port/metrics"
  scrapes+=("$out")
  # promtool reports two kinds of findings: exposition-format errors (a page it cannot parse:
  # "error while linting", exit 1) and lint problems about naming conventions (a counter without
  # _total, a unit suffix, missing help; exit 3). The names come from the C++ definitions
  # (src/owner/owner_counters.h, src/master/master_core.h, src/daemon/metrics.cc), so only
  # errors fail this check; lint problems are printed.
  rc=0
  "$PROMTOOL" check metrics < "$out" > "$WORK/$name.promtool" 2>&1 || rc=$?
  case $rc in
    0) echo "[check-metrics] $name: $(grep -cv '^#' "$out") samples, promtool: clean" ;;
    3) echo "[check-metrics] $name: $(grep -cv '^#' "$out") samples, promtool: lint only (not failing):"
       sed 's/^/    /' "$WORK/$name.promtool" ;;
    *) echo "check-metrics: $name: promtool check metrics failed (exit $rc):" >&2
       cat "$WORK/$name.promtool" >&2
       fail=1 ;;
  esac
done

python3 scripts/check-dashboard-metrics.py --promtool "$PROMTOOL" "$DASHBOARD" "${scrapes[@]}" || fail=1
[ $fail = 0 ] || exit 1
echo "[check-metrics] ok"
