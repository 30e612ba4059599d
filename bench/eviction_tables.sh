#!/bin/sh
# The eviction tables of docs/perf.md in one command: the in-memory replay of every policy, then
# the same traces through a real embedded fluxond (the default policy; OLD_FLUXOND=path adds a
# column for another binary, e.g. one built before the policy changed).
#   bench/eviction_tables.sh [TRACE_DIR]
set -e
DIR=${1:-/tmp/fluxon-eviction-traces}
mkdir -p "$DIR"
build/bench/bench_eviction_policy --dump-traces "$DIR"
PYTHONPATH=build/python python3 bench/eviction_fluxond_replay.py --traces-dir "$DIR" \
  --traces cyclic,zipf0.8,zipf1.1,zipf1.4,mix,scan,diurnal --capacities 10,25,50 \
  --fluxond new=build/src/fluxond ${OLD_FLUXOND:+--fluxond old=$OLD_FLUXOND}
