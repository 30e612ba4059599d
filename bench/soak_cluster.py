#!/usr/bin/env python3
"""Cluster soak: a master and two owners as separate fluxond processes on loopback (each with
its own config, segment, socket, admin port and TCP data plane) under put/get traffic while the
parent injects the cluster's faults, with every byte verified end to end.

Traffic (--workers threads): each worker puts batches of 1..16 pages on one owner (a page's bytes
are a pure function of its key, so any reader can verify any page) and reads keys acknowledged
earlier — by any worker, through either owner (a remote get when the other owner holds them) —
comparing every restored byte.

Faults, one every --fault-interval, in turn:
  master-restart   SIGKILL the master, restart it on the same port after 1 s (routes come back
                   through the owners' republish);
  owner-sigstop    SIGSTOP an owner past its lease + grace, then SIGCONT (it is expired, renews
                   its generation and republishes);
  owner-kill       SIGKILL an owner and start it again (a new generation: what it held is gone).

Checks (exit status 1 on any failure, 0 when all pass):
  - no restored page ever differs from what its key was written with;
  - after the last fault and a settle period, every key acknowledged on an owner that was not
    killed since is found again from the OTHER owner, byte-exact (no acknowledged route is lost
    for good while its value is held);
  - every owner's temporary state (prepared/pending slots, flights, handles, views, remote
    targets, quarantine) and the master's in-flight gets and source pins return to zero.

    PYTHONPATH=build/python python3 bench/soak_cluster.py --fluxond build/src/fluxond \\
        --duration 3m --fault-interval 15s
    python3 bench/soak.py --cluster --duration 3m     # the same, through the soak's entry point
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

try:
    import numpy as np
    import fluxon
except ImportError:  # a build tree without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build" / "python"))
    import numpy as np
    import fluxon

VALUE_LEN = 64 * 1024
LEASE_MS, GRACE_MS = 1500, 1000
TEMPORARY = ("slots_Prepared", "slots_Pending", "inflight_gets", "live_handles", "live_views",
             "prepared_puts", "reserved_entries", "remote_pending_targets",
             "remote_quarantined_slots", "remote_unfinished")

# fluxond's own line once it serves (not any log line that contains "ready").
READY = re.compile(r"^fluxond \S+ ready$", re.M)


def parse_duration(text: str) -> float:
    text = text.strip()
    for suffix, mult in (("ms", 1e-3), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(suffix) and text[:-len(suffix)].replace(".", "", 1).isdigit():
            return float(text[:-len(suffix)]) * mult
    return float(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_bytes(key: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, VALUE_LEN, dtype=np.uint8)


def cpu_seconds(pid) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid) -> int:
    """Resident memory of a process now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Proc:
    def __init__(self, fluxond: str, text: str, tmp: Path, name: str):
        self.fluxond, self.text, self.tmp, self.name = fluxond, text, tmp, name
        self.start()

    def start(self):
        cfg = self.tmp / f"{self.name}.yaml"
        cfg.write_text(self.text)
        self.log = self.tmp / f"{self.name}.{time.time_ns()}.log"
        self.p = subprocess.Popen([self.fluxond, "--config", str(cfg)],
                                  stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not READY.search(self.log.read_text()):
            if self.p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{self.name} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class Cluster:
    def __init__(self, fluxond: str, fluxonctl: str, tmp: Path, segment: str):
        self.fluxonctl, self.tmp = fluxonctl, tmp
        self.mport, self.madmin = free_port(), free_port()
        self.master = Proc(fluxond, f"""
role: master
log_level: warn
master: {{listen_address: "127.0.0.1:{self.mport}", owner_lease_ms: {LEASE_MS},
          owner_grace_ms: {GRACE_MS}, inflight_ttl_ms: 10000}}
admin: {{listen_address: "127.0.0.1:{self.madmin}", metrics_port: 0}}
""", tmp, "master")
        self.owners, self.admin, self.sock = {}, {}, {}
        for node in (1, 2):
            self.admin[node], self.sock[node] = free_port(), str(tmp / f"owner-{node}.sock")
            self.owners[node] = Proc(fluxond, f"""
role: owner
node_id: {node}
log_level: warn
admin: {{listen_address: "127.0.0.1:{self.admin[node]}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{self.mport}"
  socket_path: {self.sock[node]}
  segment: {{size: {segment}}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  transports: [tcp]
  remote_get_timeout_ms: 3000
  handle_ttl_ms: 5000
""", tmp, f"owner-{node}")

    def ctl(self, port: int, *args):
        r = subprocess.run([self.fluxonctl, "--admin", f"127.0.0.1:{port}", "--json", *args],
                           capture_output=True, text=True, timeout=20)
        if r.returncode != 0 or not r.stdout.strip().startswith("{"):
            return None
        return json.loads(r.stdout)

    def stop(self):
        for p in list(self.owners.values()) + [self.master]:
            p.stop()


class State:
    """What was acknowledged where, shared by the workers and the fault loop."""

    def __init__(self):
        self.mu = threading.Lock()
        self.acked = {}  # key -> (owner node, owner incarnation)
        self.incarnation = {1: 0, 2: 0}
        self.counts = {"puts": 0, "put_errors": 0, "gets": 0, "hits": 0, "remote_reads": 0,
                       "get_errors": 0, "mismatches": 0}
        self.failures = []
        self.max_keys = 5000  # acknowledged keys at most: the segments never need eviction

    def count(self, name, n=1):
        with self.mu:
            self.counts[name] += n


def restore_and_verify(c, keys) -> tuple:
    """get_start -> get_transfer -> copy -> release of `keys` through client `c`; returns
    (pages restored, keys whose bytes differ from what they were written with)."""
    h = c.get_start(keys)
    t = h.result.transferable_len
    if t == 0:
        c.cancel_get_transfer(h)
        return 0, []
    plan = c.get_transfer(h)
    out = np.zeros(t * VALUE_LEN, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, VALUE_LEN)
    c.release_views(plan)
    wrong = [keys[i] for i in range(t)
             if not np.array_equal(out[i * VALUE_LEN:(i + 1) * VALUE_LEN], page_bytes(keys[i]))]
    return t, wrong


def client_for(cluster: Cluster, node: int, cache: dict):
    c = cache.get(node)
    if c is None:
        c = fluxon.KvClient(socket_path=cluster.sock[node])
        cache[node] = c
    return c


def worker(wid: int, cluster: Cluster, state: State, stop: threading.Event, seed: int):
    rng = random.Random(seed * 1000 + wid)
    clients = {}
    batch_no = 0
    while not stop.is_set():
        node = rng.choice((1, 2))
        try:
            c = client_for(cluster, node, clients)
            with state.mu:
                room = len(state.acked) < state.max_keys
            if room and rng.random() < 0.4:
                n = rng.randint(1, 16)
                keys = [f"w{wid}-b{batch_no}-{i}" for i in range(n)]
                batch_no += 1
                with state.mu:
                    inc = state.incarnation[node]
                plan = c.local_fast_put_start(keys, VALUE_LEN)
                buf = np.concatenate([page_bytes(k) for k in keys])
                fluxon.copy_to_plan(plan, buf.ctypes.data, VALUE_LEN)
                c.local_fast_put_commit(plan).wait(15)
                with state.mu:
                    if state.incarnation[node] == inc:
                        for k in keys:
                            state.acked[k] = (node, inc)
                    state.counts["puts"] += 1
            else:
                with state.mu:
                    pool = list(state.acked)
                if not pool:
                    continue
                start = rng.randrange(len(pool))
                keys = pool[start:start + rng.randint(1, 16)]
                before = c.stats().get("remote_hits", 0) if rng.random() < 0.05 else None
                t, wrong = restore_and_verify(c, keys)
                state.count("gets")
                if wrong:
                    state.count("mismatches", len(wrong))
                    with state.mu:
                        state.failures += [f"owner {node} served wrong bytes for {k}" for k in wrong]
                state.count("hits", t)
                if before is not None and c.stats().get("remote_hits", 0) > before:
                    state.count("remote_reads")
        except fluxon.FluxonError:
            state.count("get_errors")
            clients.pop(node, None)  # a killed owner: reconnect on the next use
            time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - any other exception is a failure of the soak
            with state.mu:
                state.failures.append(f"worker {wid}: {type(e).__name__}: {e}")
            clients.pop(node, None)
            time.sleep(0.05)


def inject(kind: str, cluster: Cluster, state: State, rng: random.Random, log):
    if kind == "master-restart":
        cluster.master.kill()
        time.sleep(1.0)
        cluster.master.start()
        log("fault: master killed and restarted")
    elif kind == "owner-sigstop":
        node = rng.choice((1, 2))
        pid = cluster.owners[node].p.pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep((LEASE_MS + GRACE_MS) / 1000 + 0.8)
        os.kill(pid, signal.SIGCONT)
        log(f"fault: owner {node} stopped past its lease + grace, continued")
    elif kind == "owner-kill":
        node = rng.choice((1, 2))
        with state.mu:
            state.incarnation[node] += 1
            state.acked = {k: v for k, v in state.acked.items() if v[0] != node}
        cluster.owners[node].kill()
        cluster.owners[node].start()
        log(f"fault: owner {node} killed and restarted (its values are gone)")


def read_all_from_other_owner(cluster: Cluster, state: State, timeout: float):
    """Every acknowledged key, read through the owner that did not write it."""
    with state.mu:
        by_owner = {1: [], 2: []}
        for k, (node, inc) in state.acked.items():
            if state.incarnation[node] == inc:
                by_owner[node].append(k)
    missing = {}
    deadline = time.time() + timeout
    for node, keys in by_owner.items():
        other = 3 - node
        c = fluxon.KvClient(socket_path=cluster.sock[other])
        left = keys
        while left and time.time() < deadline:
            still = []
            for i in range(0, len(left), 64):
                chunk = left[i:i + 64]
                t, wrong = restore_and_verify(c, chunk)
                state.failures += [f"final read: wrong bytes for {k}" for k in wrong]
                still += chunk[t:]
            left = still
            if left:
                time.sleep(0.2)
        missing[node] = len(left)
    return {n: len(k) for n, k in by_owner.items()}, missing


def wait_baseline(cluster: Cluster, timeout: float):
    deadline = time.time() + timeout
    bad = {}
    while time.time() < deadline:
        bad = {}
        for node in (1, 2):
            s = cluster.ctl(cluster.admin[node], "stats") or {}
            for k in TEMPORARY:
                if int(s.get(k, 0)) != 0:
                    bad[f"owner{node}.{k}"] = s[k]
        m = cluster.ctl(cluster.madmin, "stats") or {}
        if int(m.get("master_inflight_gets", 0)) != 0:
            bad["master_inflight_gets"] = m["master_inflight_gets"]
        owners = (cluster.ctl(cluster.madmin, "owners") or {}).get("owners", [])
        for o in owners:
            if int(o.get("source_pins", 0)) or int(o.get("inflight_gets", 0)):
                bad[f"master.owner{o['node_id']}"] = (o.get("source_pins"), o.get("inflight_gets"))
        if not bad:
            return {}
        time.sleep(0.2)
    return bad


def run(args) -> int:
    fluxonctl = args.fluxonctl or str(Path(args.fluxond).parent / "fluxonctl")
    tmp = Path(tempfile.mkdtemp(prefix="fxsoakc"))
    log = lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    cluster = Cluster(args.fluxond, fluxonctl, tmp, args.segment)
    state = State()
    state.max_keys = args.max_keys
    stop = threading.Event()
    rng = random.Random(args.seed)
    threads = [threading.Thread(target=worker, args=(w, cluster, state, stop, args.seed))
               for w in range(args.workers)]
    faults = []
    try:
        for t in threads:
            t.start()
        began = time.time()
        kinds = ["master-restart", "owner-sigstop", "owner-kill"]
        next_fault = began + args.fault_interval
        while time.time() - began < args.duration:
            time.sleep(0.2)
            if time.time() >= next_fault:
                kind = kinds[len(faults) % len(kinds)]
                inject(kind, cluster, state, rng, log)
                faults.append(kind)
                next_fault = time.time() + args.fault_interval
        stop.set()
        for t in threads:
            t.join(timeout=60)
        stuck = [t for t in threads if t.is_alive()]
        log(f"traffic stopped after {time.time() - began:.0f} s; faults {faults}; "
            f"counts {state.counts}")
        held, missing = read_all_from_other_owner(cluster, state, args.settle_timeout)
        bad = wait_baseline(cluster, args.settle_timeout)
    finally:
        stop.set()
        cluster.stop()
    ok = True
    print("\n| cluster soak | |\n|---|---|")
    print(f"| duration, workers, seed | {args.duration:.0f} s, {args.workers}, {args.seed} |")
    print(f"| faults | {', '.join(faults) or 'none'} |")
    for k, v in state.counts.items():
        print(f"| {k} | {v} |")
    print(f"| acknowledged and held (owner 1, owner 2) | {held[1]}, {held[2]} |")
    print(f"| not found from the other owner | {missing[1]}, {missing[2]} |")
    if state.counts["mismatches"] or state.failures:
        ok = False
        for f in state.failures[:20]:
            print(f"FAIL: {f}")
    if any(missing.values()):
        ok = False
        print(f"FAIL: acknowledged values not found again from the other owner: {missing}")
    if bad:
        ok = False
        print(f"FAIL: temporary state not back at baseline: {bad}")
    if stuck:
        ok = False
        print(f"FAIL: {len(stuck)} workers stuck")
    if state.counts["hits"] == 0 or state.counts["puts"] == 0:
        ok = False
        print("FAIL: no traffic went through")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def add_arguments(ap: argparse.ArgumentParser):
    ap.add_argument("--fluxonctl", default=None)
    ap.add_argument("--fault-interval", type=parse_duration, default=parse_duration("15s"))
    ap.add_argument("--settle-timeout", type=parse_duration, default=parse_duration("30s"))
    ap.add_argument("--cluster-workers", dest="workers", type=int, default=4)
    ap.add_argument("--cluster-segment", dest="segment", default="1GiB")
    ap.add_argument("--cluster-max-keys", dest="max_keys", type=int, default=5000,
                    help="acknowledged keys at most (both owners' segments hold them and their "
                         "copies without eviction, so every one must be found again)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fluxond", default="build/src/fluxond")
    ap.add_argument("--duration", type=parse_duration, default=parse_duration("3m"))
    ap.add_argument("--seed", type=int, default=1)
    add_arguments(ap)
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
