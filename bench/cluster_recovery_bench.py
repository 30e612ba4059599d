#!/usr/bin/env python3
"""Soft-state recovery after a master restart, measured with real processes on loopback.

Starts a master and --owners owners (separate fluxond processes, each with its own config),
puts --routes values spread over the owners (4 KiB each, batches of 4,096), kills the master with
SIGKILL, restarts it on the same port after --outage seconds, and measures:
  - rediscover: restart -> every owner is registered with the new master (its heartbeat reached
    it; the control channel's reconnect backoff is capped at 1 s),
  - republish: restart -> the master routes every value again (the owners' republish),
the republish rate (routes/s), the master's CPU time from its restart until every route is back
(core-seconds, and as cores: CPU time over that interval) and its resident memory then.
Repeats --rounds times (the same owners, a new master each round) and prints each round and the
medians. --route-keys sets master.route_keys (full or fingerprint).

    PYTHONPATH=build/python python3 bench/cluster_recovery_bench.py --fluxond build/src/fluxond \\
        --routes 1000000 --rounds 3
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import fluxon


sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_cluster import Proc, cpu_seconds, free_port, rss_bytes  # noqa: E402  (one process wrapper for both benches)


def owners(fluxonctl, admin):
    r = subprocess.run([fluxonctl, "--admin", f"127.0.0.1:{admin}", "--json", "owners"],
                       capture_output=True, text=True, timeout=20)
    if r.returncode != 0 or not r.stdout.strip():
        return {}
    return {o["node_id"]: o for o in json.loads(r.stdout).get("owners", [])}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fluxond", default="build/src/fluxond")
    ap.add_argument("--fluxonctl", default=None)
    ap.add_argument("--routes", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--outage", type=float, default=1.5, help="seconds the master stays down")
    ap.add_argument("--owners", type=int, default=1, help="owners sharing the routes")
    ap.add_argument("--route-keys", choices=("full", "fingerprint"), default="full",
                    help="master.route_keys")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds a round may wait for every route")
    a = ap.parse_args()
    fluxonctl = a.fluxonctl or str(Path(a.fluxond).parent / "fluxonctl")
    value_len = 4096
    per_owner = -(-a.routes // a.owners)
    seg_gib = max(1, -(-per_owner * value_len * 5 // 4 // (1 << 30)))
    tmp = tempfile.mkdtemp(prefix="fxrec")
    mport, madmin = free_port(), free_port()
    master_cfg = f"""
role: master
log_level: warn
master: {{listen_address: "127.0.0.1:{mport}", owner_lease_ms: 5000, owner_grace_ms: 5000,
          route_keys: {a.route_keys}}}
admin: {{listen_address: "127.0.0.1:{madmin}", metrics_port: 0}}
"""
    tmp = Path(tmp)
    master = Proc(a.fluxond, master_cfg, tmp, "master")
    procs, socks = [], []
    try:
        for node in range(1, a.owners + 1):
            sock = f"{tmp}/owner{node}.sock"
            socks.append(sock)
            procs.append(Proc(a.fluxond, f"""
role: owner
node_id: {node}
log_level: warn
admin: {{listen_address: "127.0.0.1:{free_port()}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{mport}"
  socket_path: {sock}
  segment: {{size: {seg_gib}GiB}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  transports: [tcp]
""", tmp, f"owner{node}"))
        t0 = time.time()
        batch = 4096
        buf = np.full(batch * value_len, 7, dtype=np.uint8)
        for node, sock in enumerate(socks):
            c = fluxon.KvClient(socket_path=sock)
            first, last = node * per_owner, min(a.routes, (node + 1) * per_owner)
            for b in range(first, last, batch):
                keys = [f"route-{i:09d}" for i in range(b, min(last, b + batch))]
                plan = c.local_fast_put_start(keys, value_len)
                fluxon.copy_to_plan(plan, buf.ctypes.data, value_len)
                c.local_fast_put_commit(plan).wait(120)
            del c
        put_s = time.time() - t0
        routed = sum(int(o.get("routes", 0)) for o in owners(fluxonctl, madmin).values())
        print(f"put {a.routes} values over {a.owners} owner(s) in {put_s:.1f} s; master routes "
              f"{routed}, resident {rss_bytes(master.p.pid) / 2**20:,.0f} MiB")
        results = []
        for r in range(a.rounds):
            master.kill()
            time.sleep(a.outage)
            t_restart = time.time()
            master.start()
            rediscover = republish = None
            deadline = time.time() + a.timeout
            while time.time() < deadline:
                listed = owners(fluxonctl, madmin)
                now = time.time() - t_restart
                if len(listed) == a.owners and rediscover is None:
                    rediscover = now
                if sum(int(o.get("routes", 0)) for o in listed.values()) >= a.routes:
                    republish = now
                    break
                time.sleep(0.05)
            if republish is None:
                print(f"round {r + 1}: not every route back within {a.timeout} s")
                return 1
            cpu = cpu_seconds(master.p.pid)
            rss = rss_bytes(master.p.pid)
            results.append((rediscover, republish, cpu, rss))
            print(f"round {r + 1}: rediscover {rediscover:.2f} s, all {a.routes} routes back "
                  f"{republish:.2f} s ({a.routes / republish:,.0f} routes/s); master CPU "
                  f"{cpu:.2f} s ({cpu / republish:.2f} cores), resident {rss / 2**20:,.0f} MiB "
                  f"({rss / a.routes:.0f} B/route)")
        med = [statistics.median(x[i] for x in results) for i in range(4)]
        print(f"median over {a.rounds} rounds at {a.routes} routes, {a.owners} owner(s), "
              f"route_keys {a.route_keys}: rediscover {med[0]:.2f} s, republish {med[1]:.2f} s "
              f"({a.routes / med[1]:,.0f} routes/s), master CPU {med[2]:.2f} s "
              f"({med[2] / med[1]:.2f} cores), resident {med[3] / 2**20:,.0f} MiB")
    finally:
        for p in procs:
            p.stop()
        master.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
