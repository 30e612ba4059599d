#!/usr/bin/env python3
"""Master failover with standby masters elected through etcd, measured with real processes on
loopback: one etcd member, two master candidates (`election:`), owner 1 holding --routes values
(4 KiB each) and owner 2 reading them remotely. Each round faults the current leader and times,
from the fault:
  - leader:    the other master reports that it leads (its admin stats, polled every 20 ms),
  - first hit: owner 2 restores a value of owner 1 it never read before (a remote get through
               the new leader; owner 1's routes are back at least for that key),
  - all back:  the new leader routes every value again (owner 1's republish).
Faults: kill (-9: the lease runs out after its TTL), stop (SIGSTOP past the lease; resumed after
the round), term (SIGTERM: the leader revokes its lease on the way out). The faulted master is
restarted (or resumed) as the standby of the next round. Prints each round and the medians per
fault.

    PYTHONPATH=build/python python3 bench/failover_bench.py --fluxond build/src/fluxond \\
        --routes 100000 --rounds 3 --ttl 2 --faults kill,stop,term
"""

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import fluxon

sys.path.insert(0, str(Path(__file__).resolve().parent))
from election_failover import start_etcd  # noqa: E402
from soak_cluster import Proc, cpu_seconds, free_port, rss_bytes  # noqa: E402

KEY = "/fluxon/bench/failover/leader"


def stats(fluxonctl, admin):
    r = subprocess.run([fluxonctl, "--admin", f"127.0.0.1:{admin}", "--json", "--timeout-ms",
                        "500", "stats"], capture_output=True, text=True, timeout=20)
    if r.returncode != 0 or not r.stdout.strip().startswith("{"):
        return {}
    return json.loads(r.stdout)


def remote_hit(client, key, value_len):
    h = client.get_start([key])
    if h.result.transferable_len == 0:
        client.cancel_get_transfer(h)
        return False
    plan = client.get_transfer(h)
    out = np.zeros(value_len, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, value_len)
    client.release_views(plan)
    assert (out == 7).all(), "a restored value has the wrong bytes"
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fluxond", default="build/src/fluxond")
    ap.add_argument("--fluxonctl", default=None)
    ap.add_argument("--etcd", default="/usr/bin/etcd")
    ap.add_argument("--routes", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per fault")
    ap.add_argument("--ttl", type=int, default=2, help="the masters' etcd lease, seconds")
    ap.add_argument("--faults", default="kill,stop,term")
    ap.add_argument("--value-len", type=int, default=4096)
    a = ap.parse_args()
    fluxonctl = a.fluxonctl or str(Path(a.fluxond).parent / "fluxonctl")
    tmp = Path(tempfile.mkdtemp(prefix="fxfo"))
    etcd, endpoint = start_etcd(a.etcd, str(tmp))
    election = (f'election: {{endpoints: ["{endpoint}"], key: "{KEY}", lease_ttl_s: {a.ttl}, '
                f'poll_interval_ms: 100}}\n')
    admins, masters = {}, {}
    for m in ("ma", "mb"):
        admins[m] = free_port()
        masters[m] = Proc(a.fluxond, f"""
role: master
log_level: warn
master: {{listen_address: "127.0.0.1:{free_port()}", owner_lease_ms: 5000, owner_grace_ms: 5000}}
admin: {{listen_address: "127.0.0.1:{admins[m]}", metrics_port: 0}}
{election}""", tmp, m)
    seg_gib = max(1, -(-a.routes * a.value_len * 5 // 4 // (1 << 30)))
    owners = {}
    for node in (1, 2):
        owners[node] = Proc(a.fluxond, f"""
role: owner
node_id: {node}
log_level: warn
admin: {{listen_address: "127.0.0.1:{free_port()}", metrics_port: 0}}
owner:
  socket_path: {tmp}/owner{node}.sock
  segment: {{size: {seg_gib if node == 1 else 1}GiB}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  transports: [tcp]
{election}""", tmp, f"owner{node}")

    def leader(exclude=None):
        for m in masters:
            if m != exclude and masters[m].p.poll() is None and \
                    stats(fluxonctl, admins[m]).get("master_leader") == 1:
                return m
        return None

    try:
        c1 = fluxon.KvClient(socket_path=f"{tmp}/owner1.sock")
        c2 = fluxon.KvClient(socket_path=f"{tmp}/owner2.sock")
        t0 = time.time()
        batch = 4096
        buf = np.full(batch * a.value_len, 7, dtype=np.uint8)
        for b in range(0, a.routes, batch):
            keys = [f"route-{i:09d}" for i in range(b, min(a.routes, b + batch))]
            plan = c1.local_fast_put_start(keys, a.value_len)
            fluxon.copy_to_plan(plan, buf.ctypes.data, a.value_len)
            c1.local_fast_put_commit(plan).wait(120)
        print(f"put {a.routes} values of {a.value_len} B in {time.time() - t0:.1f} s")
        probe = 0
        results = {}
        for fault in a.faults.split(","):
            for r in range(a.rounds):
                deadline = time.time() + 600
                while (old := leader()) is None or \
                        stats(fluxonctl, admins[old]).get("master_routes", 0) < a.routes:
                    assert time.time() < deadline, "no leader with every route before the round"
                    time.sleep(0.05)
                sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}
                standby = next(m for m in masters if m != old)
                cpu0, rss0 = cpu_seconds(masters[standby].p.pid), rss_bytes(masters[standby].p.pid)
                masters[old].p.send_signal(sig[fault])
                t_fault = time.monotonic()
                # Three watchers, each on its own thread, so that a call blocked on the faulted
                # master (a paused one answers nothing until the call's deadline) delays only
                # what it measures.
                found = {}

                def watch_leader():
                    while (m := leader(exclude=old)) is None:
                        time.sleep(0.02)
                    found["new"], found["leader"] = m, time.monotonic() - t_fault
                    while stats(fluxonctl, admins[m]).get("master_routes", 0) < a.routes:
                        time.sleep(0.02)
                    found["all"] = time.monotonic() - t_fault

                def watch_hit():
                    while not remote_hit(c2, f"route-{probe:09d}", a.value_len):
                        time.sleep(0.01)
                    found["hit"] = time.monotonic() - t_fault
                watchers = [threading.Thread(target=f, daemon=True)
                            for f in (watch_leader, watch_hit)]
                for w in watchers:
                    w.start()
                for w in watchers:
                    w.join(timeout=600)
                assert all(k in found for k in ("leader", "hit", "all")), \
                    f"round {fault} {r}: not recovered in 600 s: {found}"
                probe += 1
                t_leader, t_hit, t_all = found["leader"], found["hit"], found["all"]
                # The new leader's work while the owners republished into it: CPU (cores busy
                # from its election to the last route) and memory per route.
                pid = masters[standby].p.pid
                cores = (cpu_seconds(pid) - cpu0) / max(t_all - t_leader, 1e-3)
                per_route = (rss_bytes(pid) - rss0) / a.routes
                results.setdefault(fault, []).append((t_leader, t_hit, t_all, cores, per_route))
                print(f"{fault} round {r + 1}: leader {t_leader:.2f} s, first remote hit "
                      f"{t_hit:.2f} s, all {a.routes} routes back {t_all:.2f} s; new leader "
                      f"{cores:.2f} cores busy, {per_route:.0f} B RSS per route", flush=True)
                if fault == "stop":
                    masters[old].p.send_signal(signal.SIGCONT)
                else:
                    masters[old].p.wait(15)
                    masters[old].start()
        for fault, rs in results.items():
            med = [statistics.median(x[i] for x in rs) for i in range(5)]
            print(f"median {fault} ({len(rs)} rounds, TTL {a.ttl} s, {a.routes} routes of "
                  f"{a.value_len} B): leader {med[0]:.2f} s, first remote hit {med[1]:.2f} s, all "
                  f"routes back {med[2]:.2f} s, {med[3]:.2f} cores, {med[4]:.0f} B/route")
    finally:
        for p in list(owners.values()) + list(masters.values()):
            p.stop()
        etcd.terminate()
        etcd.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
