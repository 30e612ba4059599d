#!/usr/bin/env python3
"""Soft-state recovery after a master restart, measured with real processes on loopback.

Starts a master and one owner (separate fluxond processes, each with its own config), puts
--routes values (4 KiB each, batches of 4,096), kills the master with SIGKILL, restarts it on the
same port after --outage seconds, and measures:
  - rediscover: restart -> the owner is registered with the new master (its heartbeat reached it;
    the control channel's reconnect backoff is capped at 1 s),
  - republish: restart -> the master routes every value again (the owner's republish),
and the republish rate (routes/s). Repeats --rounds times (the same owner, a new master each
round) and prints each round and the medians.

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
from soak_cluster import Proc, free_port  # noqa: E402  (one process wrapper for both benches)


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
    a = ap.parse_args()
    fluxonctl = a.fluxonctl or str(Path(a.fluxond).parent / "fluxonctl")
    value_len = 4096
    seg_gib = max(1, -(-a.routes * value_len * 5 // 4 // (1 << 30)))
    tmp = tempfile.mkdtemp(prefix="fxrec")
    mport, madmin, oadmin = free_port(), free_port(), free_port()
    master_cfg = f"""
role: master
log_level: warn
master: {{listen_address: "127.0.0.1:{mport}", owner_lease_ms: 5000, owner_grace_ms: 5000}}
admin: {{listen_address: "127.0.0.1:{madmin}", metrics_port: 0}}
"""
    sock = f"{tmp}/owner.sock"
    owner_cfg = f"""
role: owner
node_id: 1
log_level: warn
admin: {{listen_address: "127.0.0.1:{oadmin}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{mport}"
  socket_path: {sock}
  segment: {{size: {seg_gib}GiB}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  transports: [tcp]
"""
    tmp = Path(tmp)
    master = Proc(a.fluxond, master_cfg, tmp, "master")
    owner = Proc(a.fluxond, owner_cfg, tmp, "owner")
    try:
        c = fluxon.KvClient(socket_path=sock)
        t0 = time.time()
        batch = 4096
        buf = np.full(batch * value_len, 7, dtype=np.uint8)
        for b in range(0, a.routes, batch):
            keys = [f"route-{i:09d}" for i in range(b, min(a.routes, b + batch))]
            plan = c.local_fast_put_start(keys, value_len)
            fluxon.copy_to_plan(plan, buf.ctypes.data, value_len)
            c.local_fast_put_commit(plan).wait(120)
        put_s = time.time() - t0
        print(f"put {a.routes} values in {put_s:.1f} s; master routes "
              f"{owners(fluxonctl, madmin)[1]['routes']}")
        results = []
        for r in range(a.rounds):
            master.kill()
            time.sleep(a.outage)
            t_restart = time.time()
            master.start()
            rediscover = republish = None
            deadline = time.time() + 600
            while time.time() < deadline:
                o = owners(fluxonctl, madmin).get(1)
                now = time.time() - t_restart
                if o is not None and rediscover is None:
                    rediscover = now
                if o is not None and int(o.get("routes", 0)) >= a.routes:
                    republish = now
                    break
                time.sleep(0.05)
            results.append((rediscover, republish))
            print(f"round {r + 1}: rediscover {rediscover:.2f} s, all {a.routes} routes back "
                  f"{republish:.2f} s ({a.routes / republish:,.0f} routes/s)")
        med_d = statistics.median(x for x, _ in results)
        med_r = statistics.median(y for _, y in results)
        print(f"median over {a.rounds} rounds: rediscover {med_d:.2f} s, republish {med_r:.2f} s "
              f"({a.routes / med_r:,.0f} routes/s) at {a.routes} routes")
    finally:
        owner.stop()
        master.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
