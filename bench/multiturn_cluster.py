#!/usr/bin/env python3
"""Multi-turn hit rate on a two-owner cluster, with and without remote get between the owners.

The workload is bench/mooncake_compare.py's multi-turn one (SGLang's HiCache pattern: every turn a
session's prompt is its whole context plus new pages; restore the longest stored prefix with
get_start/get_transfer, back up the rest with local_fast_put_start/commit, batches of at most
--pages-per-batch pages), except that a session's turns alternate between the owners: session s,
turn t runs on owner (s + t) % 2, so turn t + 1 finds its context on the other owner.

Two owners, one client per owner in this process, same capacity per owner, same keys and bytes:
- remote: a `role: master` fluxond and two `role: owner` fluxonds (node 1 and 2) with TCP data
  planes; a page written through owner A is restored through owner B by remote get (B fetches it
  and keeps a copy);
- alone:  each owner alone: two single-machine (`role: embedded`) fluxonds sharing nothing; each
  serves only what was written through it.

Every page holds bytes derived from its key; page 0 and the last page of every restored batch are
checked byte for byte (mismatches must be 0). Per capacity (whole 512 MiB grants per owner) and
configuration: hit rate %; pages/s, pages restored + written over the loop's wall time with every
publish waited for (a miss costs only its write here, not the prefill it costs in serving); remote
hits / batches / bytes per owner (owner stats); pages skipped at put_start as held already by that
owner (KeyConflictError, as SGLang's backend skips them); pages written but refused at publish
because the other owner published them first (owner stat superseded: in the cluster, keys are
cluster-wide); failed puts (NoSpaceError). Rounds
alternate the order of the configurations; figures are medians. Exit status 1 on a mismatch.

    PYTHONPATH=build/python python3 bench/multiturn_cluster.py [--capacities 1GiB,2GiB] [--rounds 3]
    PYTHONPATH=build/python python3 bench/multiturn_cluster.py --quick
"""

import argparse
import atexit
import gc
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

import fluxon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mooncake_compare import chain_keys  # noqa: E402  (the same session key chains)

LIVE = []  # clusters to stop on any exit
GRANT = 512 << 20  # an owner segment is carved in grants of this size

# fluxond's own line once it serves (not any log line that contains "ready").
READY = re.compile(r"^fluxond \S+ ready$", re.M)


def slot_bytes(v):  # include/fluxon/units.h SlotSizeFor: exact fit, 4 KiB aligned
    return -(-max(v, 4096) // 4096) * 4096


def parse_size(text):
    mult = {"GiB": 1 << 30, "MiB": 1 << 20}.get(text[-3:])
    return int(float(text[:-3]) * mult) if mult else int(text)


def mem_available():
    with open("/proc/meminfo") as f:
        avail = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
    cg = "/sys/fs/cgroup/memory."  # a container's limit may be tighter than the machine
    if os.path.exists(cg + "max") and open(cg + "max").read().strip() != "max":
        avail = min(avail, int(open(cg + "max").read()) - int(open(cg + "current").read()))
    return avail


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]  # all held at once: n distinct ports
    ports = [s.bind(("127.0.0.1", 0)) or s.getsockname()[1] for s in socks]
    [s.close() for s in socks]
    return ports


def offset_of(key, span):
    """Where key's page bytes start in the base buffer: a page is base[off : off + value_len]."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "little") % span


class Cluster:
    """A master and owners 1 and 2 as fluxond processes, one attached client per owner."""

    def __init__(self, args, cap, remote):
        self.tmp = tempfile.mkdtemp(prefix="fxturns", dir="/tmp")
        self.procs, self.clients = [], []
        LIVE.append(self)
        try:
            mport, madmin, *admins = free_ports(4)
            if remote:
                self._start(args, "master", f"""role: master
log_level: warn
master: {{listen_address: "127.0.0.1:{mport}"}}
admin: {{listen_address: "127.0.0.1:{madmin}", metrics_port: 0}}
""")
                self._wait_ready(30)  # the owners register with it on start
            for node, admin in zip((1, 2), admins):
                # remote: owners of one cluster with data planes; alone: two single-machine
                # (embedded) fluxonds, each with its own master, sharing nothing.
                head = (f"role: owner\nnode_id: {node}\n" if remote else
                        'role: embedded\nmaster: {listen_address: "127.0.0.1:0"}\n')
                plane = (f'  master_address: "127.0.0.1:{mport}"\n'
                         '  data_address: "127.0.0.1:0"\n  transports: [tcp]\n' if remote else "")
                self._start(args, f"owner-{node}", f"""{head}log_level: warn
admin: {{listen_address: "127.0.0.1:{admin}", metrics_port: 0}}
owner:
  socket_path: {self.sock(node)}
  segment: {{size: {cap}}}
  local_reserve:
    expected_capacity: {{value_len: {args.value_len}, payload_capacity_bytes: {int(cap * 0.9)}}}
  heartbeat_interval_ms: 200
{plane}""")
            self._wait_ready(60)
            for node in (1, 2):
                c = fluxon.KvClient(socket_path=self.sock(node))
                c.prefault_segment()  # no first-touch faults in the measured copies
                self.clients.append(c)
        except BaseException:
            self.close()
            raise

    def sock(self, node):
        return os.path.join(self.tmp, f"owner-{node}.sock")

    def _start(self, args, name, config):
        path = os.path.join(self.tmp, name)
        with open(path + ".yaml", "w") as f:
            f.write(config)
        log = open(path + ".log", "w")
        p = subprocess.Popen([args.fluxond, "--config", path + ".yaml"], stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)  # stopped in order by close(), not by ^C
        self.procs.append((path + ".log", p, log))

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            logs = {path: open(path, errors="replace").read() for path, _, _ in self.procs}
            if all(READY.search(text) for text in logs.values()):
                return
            for path, p, _ in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{path}: exited ({p.returncode}):\n{logs[path][-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fluxond not ready after {timeout} s (logs in {self.tmp})")
            time.sleep(0.05)

    def close(self):
        self.clients.clear()
        gc.collect()  # unmaps the segments before their owners go
        owners, master = self.procs[1:], self.procs[:1]  # the owners go while the master answers
        for group in (owners, master):
            for _, p, _ in group:
                if p.poll() is None:
                    p.terminate()
            for _, p, log in group:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=15)
                log.close()
        self.procs = []
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self in LIVE:
            LIVE.remove(self)


class Owner:
    """One owner's client doing what mooncake_compare's FluxonSide does, on keyed page bytes."""

    def __init__(self, client, args, base, out):
        self.c, self.v, self.threads = client, args.value_len, args.copy_threads
        self.base, self.out = base, out
        self.span = len(base) - self.v + 1
        self.futures = []  # one per committed batch, settled after the loop
        self.bad = self.checked = self.skipped = 0

    def exists(self, keys):
        h = self.c.get_start(keys)
        n = h.result.raw_prefix_hit_len
        self.c.cancel_get_transfer(h)
        return n

    def get(self, keys):
        h = self.c.get_start(keys)
        n = h.result.transferable_len
        if n == 0:
            self.c.cancel_get_transfer(h)
            return 0
        plan = self.c.get_transfer(h)
        fluxon.copy_from_plan(plan, self.out.ctypes.data, self.v, self.threads)
        self.c.release_views(plan)
        for i in sorted({0, n - 1}):
            off = offset_of(keys[i], self.span)
            self.checked += 1
            self.bad += not np.array_equal(self.out[i], self.base[off:off + self.v])
        return n

    def put(self, keys, parent=None):
        """Pages written. Pages this owner holds are skipped at put_start, as SGLang's backend does;
        pages the other owner published first are written but refused when published."""
        try:
            opts = fluxon.PutOptionalArgs(parent_key=parent)  # the page before keys[0]
            plan = self.c.local_fast_put_start(keys, self.v, opts)
        except fluxon.KeyConflictError as e:
            skip = set(e.conflict_indices)
            self.skipped += len(skip)
            rest = [k for i, k in enumerate(keys) if i not in skip]
            return self.put(rest, parent if 0 not in skip else None) if rest else 0
        except fluxon.NoSpaceError:
            return 0
        ptrs = [self.base.ctypes.data + offset_of(k, self.span) for k in keys]
        fluxon.copy_segments_to_plan(plan, ptrs, [self.v] * len(keys), 1, self.v, self.threads)
        self.futures.append(self.c.local_fast_put_commit(plan))
        return len(keys)


def multiturn(owners, args):
    """mooncake_compare.multiturn with session s, turn t on owner (s + t) % 2."""
    b = args.pages_per_batch
    requested = hit = written = failed = 0
    t0 = time.perf_counter()
    for turn in range(args.turns):
        for s in range(args.sessions):
            side = owners[(s + turn) % 2]
            pages = args.first_turn_pages + turn * args.pages_per_turn
            keys = chain_keys(s, pages, "mt")
            requested += pages
            prefix = 0
            while prefix < pages:
                batch = keys[prefix:prefix + b]
                n = side.exists(batch)
                if n == 0:
                    break
                got = side.get(batch[:n])
                prefix += got
                if got < len(batch):
                    break
            hit += prefix
            for i in range(prefix, pages, b):
                batch = keys[i:i + b]
                before = side.skipped
                ok = side.put(batch, keys[i - 1] if i > 0 else None)
                written += ok
                failed += len(batch) - ok - (side.skipped - before)
    for f in owners[0].futures + owners[1].futures:
        try:
            f.wait(60)
        except fluxon.KeyConflictError:  # keys published first through the other owner
            pass
    secs = time.perf_counter() - t0
    return {"hit rate %": 100.0 * hit / requested, "pages/s": (hit + written) / secs,
            "seconds": secs, "restored": hit, "written": written, "failed puts": failed,
            "skipped": sum(o.skipped for o in owners), "checked": sum(o.checked for o in owners),
            "mismatches": sum(o.bad for o in owners)}


def run_one(args, cap, config, base, out):
    cluster, owners = Cluster(args, cap, config == "remote"), None
    try:
        owners = [Owner(c, args, base, out) for c in cluster.clients]
        r = multiturn(owners, args)
        for node, c in zip((1, 2), cluster.clients):
            s = c.stats()
            for k in ("remote_hits", "remote_get_batches", "remote_bytes", "remote_misses",
                      "superseded", "evicted_pages"):
                r[f"owner{node} {k}"] = s.get(k, 0)
        r["refused"] = r["owner1 superseded"] + r["owner2 superseded"]
        return r
    finally:
        owners = None  # the clients go before their owners
        cluster.close()


def capacities(args, ws, client_bytes):
    """Per-owner capacities: given, or whole grants near 1/4, 1/2 and all of the working set."""
    v, b = args.value_len, args.pages_per_batch
    budget = 0.6 * mem_available()
    if args.capacities:
        caps = [parse_size(c) for c in args.capacities.split(",")]
    else:
        least = -(-b // (GRANT // slot_bytes(v))) * GRANT  # one batch must fit
        caps = sorted({max(least, round(ws * v * f / GRANT) * GRANT) for f in (0.25, 0.5, 1.0)})
        caps = [c for c in caps if 2 * c + client_bytes < budget] or caps[:1]
    for c in caps:
        if c % GRANT or c == 0:
            raise SystemExit(f"capacity {c} B is not a whole number of 512 MiB grants")
        if 2 * c + client_bytes >= budget:
            raise SystemExit(f"2 x {c / 2**30:.2f} GiB + client buffers exceed 60% of the "
                             f"available memory ({budget / 0.6 / 2**30:.1f} GiB); lower "
                             "--capacities")
        if c // GRANT * (GRANT // slot_bytes(v)) < b:
            raise SystemExit(f"capacity {c} B holds less than one batch of {b} x {v} B")
    return caps


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--value-len", type=int, default=4_718_592)
    ap.add_argument("--pages-per-batch", type=int, default=128)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-turn-pages", type=int, default=16)
    ap.add_argument("--pages-per-turn", type=int, default=8)
    ap.add_argument("--capacities", default="",
                    help="per owner, comma list (e.g. 1GiB,2GiB); default: 1/4, 1/2 and all of the "
                         "working set, those that fit in memory")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copy-threads", type=int, default=2)
    ap.add_argument("--fluxond", default=os.environ.get("FLUXOND", "build/src/fluxond"))
    ap.add_argument("--json", metavar="FILE", help="write every run and the medians here")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 MiB pages, small workload")
    if "--quick" in sys.argv[1:]:  # smaller defaults; options given explicitly still win
        ap.set_defaults(value_len=1 << 20, pages_per_batch=16, sessions=4, turns=4,
                        first_turn_pages=8, pages_per_turn=12, rounds=1)
    args = ap.parse_args()
    v, b = args.value_len, args.pages_per_batch
    ws = args.sessions * (args.first_turn_pages + (args.turns - 1) * args.pages_per_turn)
    base_len = max(b, 2) * v  # as large as a batch: the sources of the puts are not cache-hot
    caps = capacities(args, ws, b * v + base_len)
    signal.signal(signal.SIGTERM, lambda sig, _: sys.exit(128 + sig))  # unwinds: clusters stop
    signal.signal(signal.SIGHUP, lambda sig, _: sys.exit(128 + sig))
    atexit.register(lambda: [c.close() for c in list(LIVE)])
    base = np.frombuffer(np.random.default_rng(7).bytes(base_len), dtype=np.uint8).copy()
    out = np.ones((b, v), dtype=np.uint8)  # touched: no first-touch faults in the timed copies
    print(f"working set {ws} pages = {ws * v / 2**30:.2f} GiB; {args.sessions} sessions x "
          f"{args.turns} turns, {args.first_turn_pages} + {args.pages_per_turn}/turn pages of "
          f"{v} B, batches <= {b}; GiB per owner: " + ", ".join(f"{c / 2**30:.2f}" for c in caps),
          file=sys.stderr)
    runs, configs = [], ("remote", "alone")
    for cap in caps:
        for rnd in range(args.rounds):
            for config in (configs if rnd % 2 == 0 else configs[::-1]):
                r = run_one(args, cap, config, base, out)
                r.update(capacity=cap, config=config, round=rnd)
                runs.append(r)
                print(f"{cap / 2**30:.2f} GiB {config:6s} round {rnd + 1}: hit "
                      f"{r['hit rate %']:.1f}%, {r['pages/s']:.0f} pages/s, remote hits "
                      f"{r['owner1 remote_hits']}/{r['owner2 remote_hits']}, {r['seconds']:.1f} s",
                      file=sys.stderr)
    med = {}
    for cap in caps:
        for config in configs:
            rs = [r for r in runs if r["capacity"] == cap and r["config"] == config]
            m = med[(cap, config)] = {k: float(np.median([r[k] for r in rs])) for k in rs[0]
                                      if isinstance(rs[0][k], (int, float)) and k != "round"}
            for k in ("mismatches", "checked"):  # summed over the rounds
                m[k] = sum(r[k] for r in rs)
    print(f"\nmedians of {args.rounds} round(s); remote hits, batches and MiB as owner 1 / owner 2")
    print("| capacity/owner GiB | config | hit rate % | pages/s | remote hits | remote batches | "
          "remote MiB | skipped | refused | failed puts | mismatches |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for (cap, config), m in med.items():
        two = lambda k, d=1: f"{m['owner1 ' + k] / d:.0f} / {m['owner2 ' + k] / d:.0f}"
        print(f"| {cap / 2**30:.2f} | {config} | {m['hit rate %']:.1f} | {m['pages/s']:.0f} | "
              f"{two('remote_hits')} | {two('remote_get_batches')} | {two('remote_bytes', 2**20)}"
              f" | {m['skipped']:.0f} | {m['refused']:.0f} | {m['failed puts']:.0f} | "
              f"{m['mismatches']:.0f} of {m['checked']:.0f} |")
    for cap in caps:
        r, a = med[(cap, "remote")], med[(cap, "alone")]
        ratio = r["pages/s"] / a["pages/s"] if a["pages/s"] else float("nan")
        print(f"{cap / 2**30:.2f} GiB per owner: remote - alone = "
              f"{r['hit rate %'] - a['hit rate %']:+.1f} hit-rate points, "
              f"pages/s ratio {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            medians = [{"capacity": c, "config": n, **m} for (c, n), m in med.items()]
            json.dump({"args": vars(args), "runs": runs, "medians": medians}, f, indent=1)
    return 1 if any(r["mismatches"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
