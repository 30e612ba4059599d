#!/usr/bin/env python3
"""Remote get between two owners, Fluxon vs Mooncake Store, on loopback: same bytes, same batches.

A writer process puts N batches of P pages (value_len bytes each, deterministic content) through
node A; a reader process on node B restores every batch into a host numpy buffer. The bytes live
only on A, so every first read crosses the TCP data plane from A to B.

- Fluxon: a `role: master` fluxond and two `role: owner` fluxonds (node 1 and 2, data planes on
  127.0.0.1, transports [tcp]). Client A attaches to owner A: local_fast_put_start + native copy
  + local_fast_put_commit, each commit waited for. Client B attaches to owner B and times, per
  batch, get_start (it answers once the owner has fetched the pages: start→ready), get_transfer,
  copy_from_plan and release_views.
- fluxon-deferred: the same, with get_start(allow_deferred=True): owner B answers after its
  lookup and fetches in the background; get_transfer waits for the pages (its time is the fetch).
- fluxon-pipelined: deferred, and batch i+1's get_start is issued right after batch i's
  get_transfer, so the next batch's fetch overlaps this batch's copy (a restore loop that looks
  one batch ahead). Its batch time is batch i's start + transfer + copy + release.
- Mooncake: a mooncake_master and two MooncakeDistributedStore clients over "tcp" with
  P2PHANDSHAKE. Client A mounts a global segment that holds every page and puts with
  batch_put_from from a registered buffer; client B mounts no segment (global_segment_size 0) and
  is started only after A's puts, so no replica can be on B; it reads with batch_get_into into
  its registered buffer.

Per batch two pages are checked byte for byte against what A wrote. Pages not restored (a miss:
get_start's transferable_len short of the batch) are counted, not fatal. GB/s and pages/s are
bytes restored over the summed batch times of the restore loop (checks excluded). Each batch is
read once remotely, then a second pass reads everything again: for Fluxon that pass is served
from B's own copy (the local baseline); Mooncake keeps no copy on the reader, so its second pass
is remote again. The control-path share is (get_start + get_transfer + release_views) over the
batch time: get_start holds the remote fetch, so set it against the second pass's get_start.
Rounds alternate which system goes first; the summary gives medians over rounds and the ratios.
Exit status 1 when a page was missed or wrong or a call failed; --json FILE keeps every figure.

    pip install mooncake-transfer-engine-non-cuda   # provides mooncake_master
    PYTHONPATH=build/python python3 bench/remote_get_compare.py [--rounds 3] [--batches 4]
    PYTHONPATH=build/python python3 bench/remote_get_compare.py --quick --sides mooncake
    PYTHONPATH=build/python python3 bench/remote_get_compare.py --sides \
        fluxon,fluxon-deferred,fluxon-pipelined --ceiling build/bench/bench_transport
"""

import argparse
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

GRANT = 512 << 20
SEED = 20240607


def pct(xs, p):
    return float(np.percentile(np.array(xs) * 1e3, p)) if xs else float("nan")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]  # all held at once: n distinct ports
    ports = [s.bind(("127.0.0.1", 0)) or s.getsockname()[1] for s in socks]
    [s.close() for s in socks]
    return ports


# ---- page contents: page j of batch i is base(j) XOR a per-batch byte, stamped with (i, j) ------

def base_page(j, v):
    return np.frombuffer(np.random.default_rng([SEED, j]).bytes(v), dtype=np.uint8)


def fill_batch(dst, base, i):
    np.bitwise_xor(base, np.uint8((i * 37 + 11) & 0xFF), out=dst)
    for j in range(len(dst)):
        dst[j, :16] = np.frombuffer(struct.pack("<QQ", i, j), dtype=np.uint8)


def page_ok(got, i, j, v):
    want = np.bitwise_xor(base_page(j, v), np.uint8((i * 37 + 11) & 0xFF))
    want[:16] = np.frombuffer(struct.pack("<QQ", i, j), dtype=np.uint8)
    return np.array_equal(got, want)


def keys_of(i, n):
    return [f"rg-{i}-{j}" for j in range(n)]


# ---- worker processes ---------------------------------------------------------------------------

class Node:
    def register(self, buf):
        pass

    def extra(self):
        return {}

    def close(self):
        pass


class FluxonNode(Node):
    def __init__(self, w):
        import fluxon
        self.fx, self.v, self.threads = fluxon, w["value_len"], w["copy_threads"]
        self.deferred = w["side"] in ("fluxon-deferred", "fluxon-pipelined")
        self.c = fluxon.KvClient(socket_path=w["endpoint"])
        self.c.prefault_segment()

    def put(self, keys, ptr):
        try:
            plan = self.c.local_fast_put_start(keys, self.v)
            self.fx.copy_to_plan(plan, ptr, self.v, self.threads)
            self.c.local_fast_put_commit(plan).wait(60)
        except self.fx.FluxonError as e:
            return 0, f"{type(e).__name__}: {e}"
        return len(keys), None

    def get(self, keys, ptr):
        """(restored pages, {phase: seconds}, diagnostics)."""
        t0 = time.perf_counter()
        h = self.c.get_start(keys, allow_deferred=self.deferred)
        t1 = time.perf_counter()
        r = h.result
        diag = {"local_pinned": r.local_pinned, "inflight_joined": r.inflight_joined,
                "leader_started": r.leader_started}
        n = r.transferable_len
        if n == 0:
            self.c.cancel_get_transfer(h)
            return 0, {"start": t1 - t0, "total": time.perf_counter() - t0}, diag
        plan = self.c.get_transfer(h)
        t2 = time.perf_counter()
        self.fx.copy_from_plan(plan, ptr, self.v, self.threads)
        t3 = time.perf_counter()
        self.c.release_views(plan)
        t4 = time.perf_counter()
        return n, {"start": t1 - t0, "transfer": t2 - t1, "copy": t3 - t2, "release": t4 - t3,
                   "total": t4 - t0}, diag

    def pipelined(self, batches, ptr, check):
        """fluxon-deferred: batch i+1's get_start (answered at once, its fetch under way) is
        issued right after batch i's get_transfer, so the next fetch overlaps this copy. Yields
        what get() returns, per batch; `check(i, n)` runs after batch i's copy."""
        def start(keys):
            t0 = time.perf_counter()
            h = self.c.get_start(keys, allow_deferred=True)
            return h, time.perf_counter() - t0
        h, start_s = start(batches[0])
        for i in range(len(batches)):
            r = h.result
            diag = {"local_pinned": r.local_pinned, "inflight_joined": r.inflight_joined,
                    "leader_started": r.leader_started, "deferred": int(r.deferred)}
            t1 = time.perf_counter()
            plan = self.c.get_transfer(h) if r.transferable_len else None
            t2 = time.perf_counter()
            nxt, nxt_s = start(batches[i + 1]) if i + 1 < len(batches) else (None, 0.0)
            t3 = time.perf_counter()
            if plan is None:
                self.c.cancel_get_transfer(h)
            else:
                self.fx.copy_from_plan(plan, ptr, self.v, self.threads)
            t4 = time.perf_counter()
            if plan is not None:
                self.c.release_views(plan)
            t5 = time.perf_counter()
            check(i, r.transferable_len)
            yield r.transferable_len, {
                "start": start_s, "transfer": t2 - t1, "copy": t4 - t3, "release": t5 - t4,
                "total": start_s + (t2 - t1) + (t5 - t3)}, diag
            h, start_s = nxt, nxt_s

    def extra(self):  # the owner's counters, seen from client B
        return {"client_stats": {k: v for k, v in self.c.stats().items()
                                 if isinstance(v, (int, float))}}


class MooncakeNode(Node):
    def __init__(self, w):
        from mooncake.store import MooncakeDistributedStore
        self.v = w["value_len"]
        self.s = MooncakeDistributedStore()
        rc = self.s.setup("127.0.0.1", "P2PHANDSHAKE", w["segment"], 16 << 20, "tcp", "",
                          w["endpoint"])
        if rc != 0:
            raise SystemExit(f"mooncake setup returned {rc}")

    def register(self, buf):
        if self.s.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
            raise SystemExit("mooncake register_buffer failed")

    def put(self, keys, ptr):
        v = self.v
        r = self.s.batch_put_from(keys, [ptr + i * v for i in range(len(keys))], [v] * len(keys))
        ok = sum(1 for x in r if x == 0)
        return ok, (None if ok == len(keys) else f"batch_put_from codes {sorted(set(r))}")

    def get(self, keys, ptr):
        v = self.v
        t0 = time.perf_counter()
        r = self.s.batch_get_into(keys, [ptr + i * v for i in range(len(keys))], [v] * len(keys))
        t = time.perf_counter() - t0
        n = next((k for k, x in enumerate(r) if x != v), len(r))  # restored prefix, as Fluxon's
        return n, {"total": t}, {}

    def close(self):
        self.s.close()


def worker(w):
    signal.alarm(int(w["timeout"]))  # a hard bound on the worker's life
    node = (FluxonNode if w["side"].startswith("fluxon") else MooncakeNode)(w)
    v, b, nb = w["value_len"], w["pages"], w["batches"]
    buf = np.ones((b, v), dtype=np.uint8)  # touched: no first-touch faults in the timed copies
    node.register(buf)
    out = {"errors": [], "passes": {}}
    if w["role"] == "put":
        base = np.empty((b, v), dtype=np.uint8)
        for j in range(b):
            base[j] = base_page(j, v)
        put_s, stored = [], 0
        for i in list(range(nb)) + ["warm"]:
            fill_batch(buf, base, nb if i == "warm" else i)
            t0 = time.perf_counter()
            ok, err = node.put(keys_of(i, b), buf.ctypes.data)
            put_s.append(time.perf_counter() - t0)
            stored += ok
            if err:
                out["errors"].append(f"batch {i}: {err}")
        out.update(stored=stored, put_p50_ms=pct(put_s, 50))
        print("RESULT " + json.dumps(out), flush=True)
        sys.stdin.readline()  # the pages must outlive the reader (Mooncake serves them from A)
        node.close()
        return 0
    # Reader: one unmeasured warm-up batch (connections, first faults), then the timed passes.
    node.get(keys_of("warm", b), buf.ctypes.data)
    for name in ("remote", "second"):
        rows = []
        if w.get("pipelined") and name == "remote":
            def check(i, n):
                bad = sum(0 if page_ok(buf[j], i, j, v) else 1 for j in {i % b, b - 1} if j < n)
                rows.append({"bad": bad})
            try:
                got = list(node.pipelined([keys_of(i, b) for i in range(nb)], buf.ctypes.data,
                                          check))
                for row, (n, t, diag) in zip(rows, got):
                    row.update(n=n, t=t, diag=diag)
            except Exception as e:  # a failed get is a result, not a crash
                out["errors"].append(f"{name} pipelined: {type(e).__name__}: {e}")
                rows = [{"n": 0, "t": {}, "diag": {}, "bad": 0}]
            out["passes"][name] = rows
            continue
        for i in range(nb):
            try:
                n, t, diag = node.get(keys_of(i, b), buf.ctypes.data)
            except Exception as e:  # a failed get is a result, not a crash
                out["errors"].append(f"{name} batch {i}: {type(e).__name__}: {e}")
                rows.append({"n": 0, "t": {}, "diag": {}, "bad": 0})
                continue
            bad = sum(0 if page_ok(buf[j], i, j, v) else 1 for j in {i % b, b - 1} if j < n)
            rows.append({"n": n, "t": t, "diag": diag, "bad": bad})
        out["passes"][name] = rows
    out.update(node.extra())
    print("RESULT " + json.dumps(out), flush=True)
    node.close()
    return 0


# ---- coordinator --------------------------------------------------------------------------------

class Procs:
    """Every process this run started; close() ends them all, the newest first."""

    def __init__(self, tmp):
        self.tmp, self.items = tmp, []

    def start(self, name, argv, **kw):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=kw.pop("stdout", subprocess.DEVNULL), stderr=log, **kw)
        self.items.append((name, p, log))
        return p

    def log_tail(self, name, n=15):
        with open(os.path.join(self.tmp, name + ".log"), errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def close(self):
        for _, p, _ in reversed(self.items):
            if p.poll() is None:
                p.terminate()
        for _, p, log in reversed(self.items):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=15)
            log.close()
        self.items = []


def wait_for(what, cond, procs, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for name, p, _ in procs.items:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}:\n"
                                   + procs.log_tail(name))
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def start_fluxon(args, tmp, procs):
    mport, madmin, *rest = free_ports(8)
    cfg = os.path.join(tmp, "master.yaml")
    with open(cfg, "w") as f:
        f.write(f'role: master\nlog_level: warn\nmaster: {{listen_address: "127.0.0.1:{mport}"}}\n'
                f'admin: {{listen_address: "127.0.0.1:{madmin}", metrics_port: 0}}\n')
    procs.start("fluxon-master", [args.fluxond, "--config", cfg])
    wait_for("the fluxon master", lambda: port_open(mport) and port_open(madmin), procs, 30)
    socks = []
    for node, (admin, data) in ((1, rest[0:2]), (2, rest[2:4])):
        sock = os.path.join(tmp, f"owner-{node}.sock")
        cfg = os.path.join(tmp, f"owner-{node}.yaml")
        with open(cfg, "w") as f:
            f.write(f"""role: owner
node_id: {node}
log_level: warn
admin: {{listen_address: "127.0.0.1:{admin}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{mport}"
  socket_path: {sock}
  segment: {{size: {args.segment}}}
  data_address: "127.0.0.1:{data}"
  transports: [tcp]
  local_reserve:
    expected_capacity: {{value_len: {args.value_len}, payload_capacity_bytes: {args.payload}}}
""")
        procs.start(f"fluxon-owner-{node}", [args.fluxond, "--config", cfg])
        socks.append(sock)
    wait_for("the owners' sockets", lambda: all(os.path.exists(s) for s in socks), procs, 60)
    ctl = os.path.join(os.path.dirname(args.fluxond), "fluxonctl")
    if os.access(ctl, os.X_OK):  # both owners registered with their data planes
        def registered():
            r = subprocess.run([ctl, "--admin", f"127.0.0.1:{madmin}", "--json", "owners"],
                               capture_output=True, text=True, timeout=10)
            return r.returncode == 0 and all(f":{p}" in r.stdout for p in (rest[1], rest[3]))
        wait_for("both owners registered", registered, procs, 30)
    return socks


def start_mooncake(args, tmp, procs):
    master = shutil.which("mooncake_master")
    if master is None:
        raise SystemExit("mooncake_master not found: pip install mooncake-transfer-engine-non-cuda")
    port, metrics = free_ports(2)
    procs.start("mooncake-master", [master, f"--rpc_port={port}", f"--metrics_port={metrics}",
                                    "--enable_metric_reporting=false"])
    wait_for("mooncake_master", lambda: port_open(port), procs, 30)
    addr = f"127.0.0.1:{port}"
    return addr, addr


def start_worker(procs, name, args, side, role, endpoint, segment):
    w = {"side": side, "role": role, "endpoint": endpoint, "segment": segment,
         "value_len": args.value_len, "pages": args.pages_per_batch, "batches": args.batches,
         "copy_threads": args.copy_threads, "timeout": args.timeout,
         "pipelined": side == "fluxon-pipelined"}
    return procs.start(name, [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(w)],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def read_result(procs, name, p, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], 1.0)
        if ready:
            line = p.stdout.readline()
            if line.startswith(b"RESULT "):
                return json.loads(line[7:])
            if not line:
                break
        elif p.poll() is not None:
            break
    raise RuntimeError(f"{name}: no result (rc {p.poll()}):\n" + procs.log_tail(name))


def summarize(side, rnd, name, rows, args):
    ts = [r["t"] for r in rows]
    col = lambda k: [t[k] for t in ts if k in t]
    restored = sum(r["n"] for r in rows)
    total = sum(col("total"))
    ctl = [t["start"] + t["transfer"] + t["release"] for t in ts if "transfer" in t]
    d = {"side": side, "round": rnd, "pass": name, "restored": restored,
         "missed": args.batches * args.pages_per_batch - restored,
         "bad_pages": sum(r["bad"] for r in rows),
         "GB/s": restored * args.value_len / total / 1e9 if total else 0.0,
         "pages/s": restored / total if total else 0.0,
         "batch p50 ms": pct(col("total"), 50), "batch p99 ms": pct(col("total"), 99),
         "control share %": 100 * sum(ctl) / total if ctl and total else float("nan")}
    for k in ("start", "transfer", "copy", "release"):
        d[f"{k} p50 ms"], d[f"{k} p99 ms"] = pct(col(k), 50), pct(col(k), 99)
    for k in ("local_pinned", "inflight_joined", "leader_started"):
        if any(k in r["diag"] for r in rows):
            d[k] = sum(r["diag"].get(k, 0) for r in rows)
    return d


def run_round(side, rnd, args):
    tmp = tempfile.mkdtemp(prefix="fxremote", dir="/tmp")
    procs = Procs(tmp)
    try:
        if side.startswith("fluxon"):
            ep_a, ep_b = start_fluxon(args, tmp, procs)
        else:
            ep_a, ep_b = start_mooncake(args, tmp, procs)
        a = start_worker(procs, f"{side}-writer", args, side, "put", ep_a, args.segment)
        put = read_result(procs, f"{side}-writer", a, args.timeout)
        # The reader starts once every page is on A (a Mooncake reader mounts nothing anyway).
        b = start_worker(procs, f"{side}-reader", args, side, "get", ep_b, 0)
        got = read_result(procs, f"{side}-reader", b, args.timeout)
        a.stdin.close()  # lets the writer go
        rows = [summarize(side, rnd, n, got["passes"][n], args) for n in ("remote", "second")]
        errors = put["errors"] + got["errors"]
        rows[0].update(errors=len(errors), stored=put["stored"], put_p50_ms=put["put_p50_ms"],
                       error_text=errors[:5], **{k: v for k, v in got.items()
                                                 if k not in ("passes", "errors")})
        return rows
    finally:
        procs.close()
        shutil.rmtree(tmp, ignore_errors=True)


def mem_available():
    with open("/proc/meminfo") as f:
        avail = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
    cg = "/sys/fs/cgroup/memory."  # a container's limit may be tighter than the machine
    if os.path.exists(cg + "max") and open(cg + "max").read().strip() != "max":
        avail = min(avail, int(open(cg + "max").read()) - int(open(cg + "current").read()))
    return avail


def size_run(args):
    """Segment per owner and payload to prewarm; fewer batches when memory is short."""
    v, b = args.value_len, args.pages_per_batch
    slot = max(v + 4095, 4096) // 4096 * 4096
    budget, asked = int(mem_available() * args.mem_fraction), args.batches
    while True:
        pages = (args.batches + 1) * b  # + the warm-up batch
        grants = -(-pages // max(1, GRANT // slot))
        seg = max(-(-int(pages * slot * 1.15) // GRANT), grants + 1) * GRANT
        # Peak of a Fluxon round: two segments, the writer's base + batch, the reader's batch.
        need = 2 * seg + 3 * b * v
        if need <= budget or args.batches == 1:
            break
        args.batches -= 1
    if need > budget:
        raise SystemExit(f"one batch needs {need / 2**30:.1f} GiB, {budget / 2**30:.1f} GiB "
                         "usable; lower --pages-per-batch or --value-len")
    if args.batches != asked:
        print(f"memory short ({budget / 2**30:.1f} GiB usable): {args.batches} batches, not "
              f"{asked}", file=sys.stderr)
    args.segment, args.payload = seg, pages * v


MEDIANS = ("GB/s", "pages/s", " ms", " %")
COLUMNS = (("GB/s", "GB/s", 7, 2), ("pages/s", "pages/s", 9, 0),
           ("batch p50", "batch p50 ms", 10, 2), ("p99", "batch p99 ms", 8, 2),
           ("start→ready p50", "start p50 ms", 16, 2), ("p99", "start p99 ms", 8, 2),
           ("transfer p50", "transfer p50 ms", 13, 2), ("copy p50", "copy p50 ms", 9, 2),
           ("release p50", "release p50 ms", 12, 3), ("ctl %", "control share %", 7, 1),
           ("missed", "missed", 7, 0), ("bad", "bad_pages", 4, 0))


def print_table(rows, title):
    head = "".join(f"{h:>{w}}" for h, _, w, _ in COLUMNS)
    print(f"\n{title}\n{'side':<16}{'round':>5} {'pass':<7}{head}")
    for x in rows:
        cells = (f"{x[k]:>{w}.{p}f}" if x[k] == x[k] else f"{'-':>{w}}" for _, k, w, p in COLUMNS)
        print(f"{x['side']:<16}{x['round']:>5} {x['pass']:<7}" + "".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sides", default="fluxon,mooncake")
    ap.add_argument("--value-len", type=int)
    ap.add_argument("--pages-per-batch", type=int)
    ap.add_argument("--batches", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--quick", action="store_true", help="1 MiB pages, 2 batches of 32, 1 round")
    ap.add_argument("--copy-threads", type=int, default=2)
    ap.add_argument("--mem-fraction", type=float, default=0.6, help="share of MemAvailable to use")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per worker")
    ap.add_argument("--fluxond", default=os.environ.get("FLUXOND", "build/src/fluxond"))
    ap.add_argument("--json", help="write every row and the summary to this file")
    ap.add_argument("--ceiling", metavar="BENCH_TRANSPORT",
                    help="also run this bench_transport (same values, 4 connections like an "
                         "owner's, reading into shared memory) after each round: the transport's "
                         "own ceiling, set against every Fluxon side's remote pass")
    ap.add_argument("--ceiling-peer", metavar="TRANSPORT_PEER",
                    help="bench_transport's --peer (default: its own)")
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    quick = dict(value_len=1 << 20, pages_per_batch=32, batches=2, rounds=1)
    full = dict(value_len=4_718_592, pages_per_batch=128, batches=4, rounds=3)
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    sides = [s for s in args.sides.split(",") if s]
    if not set(sides) <= {"fluxon", "fluxon-deferred", "fluxon-pipelined", "mooncake"}:
        raise SystemExit("--sides takes fluxon, fluxon-deferred, fluxon-pipelined, mooncake")
    if any(s.startswith("fluxon") for s in sides) and not os.access(args.fluxond, os.X_OK):
        raise SystemExit(f"{args.fluxond} not found: build the project first")
    size_run(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks end every process
    print(f"{args.batches} batches x {args.pages_per_batch} pages x {args.value_len} B, segment "
          f"{args.segment / 2**30:.1f} GiB per node, loopback tcp, {args.rounds} round(s)",
          file=sys.stderr)
    rows = []
    args.ceilings = []
    for r in range(args.rounds):
        if args.ceiling:
            args.ceilings.append(transport_ceiling(args))
            print(f"round {r + 1} transport ceiling: {args.ceilings[-1]:.2f} GB/s", file=sys.stderr)
        for side in (sides if r % 2 == 0 else sides[::-1]):
            try:
                rows += run_round(side, r + 1, args)
            except RuntimeError as e:  # a daemon or worker that failed: its log tail says why
                print(f"round {r + 1} {side} failed: {e}", file=sys.stderr)
                return 1
            x = rows[-2]
            print(f"round {r + 1} {side}: {x['GB/s']:.2f} GB/s, missed {x['missed']}, "
                  f"bad {x['bad_pages']}, errors {x['errors']}", file=sys.stderr)
            for e in x["error_text"]:
                print(f"  {e}", file=sys.stderr)
    return report(rows, sides, args)


def transport_ceiling(args):
    """fluxon-tcp GB/s of bench_transport over the same values (its table's median)."""
    cmd = [args.ceiling, "--rounds=1", f"--batches={args.batches}", "--connections=4",
           "--local=shm", f"--values={args.pages_per_batch}", f"--value-len={args.value_len}"]
    if args.ceiling_peer:
        cmd.append(f"--peer={args.ceiling_peer}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 2 and cells[0] == "fluxon-tcp" and cells[1] == "4":
            return float(cells[2])
    raise RuntimeError(f"no fluxon-tcp row in bench_transport's output:\n{out[-2000:]}")


def report(rows, sides, args):
    print_table(rows, f"every round ({args.batches} batches x {args.pages_per_batch} pages x "
                f"{args.value_len} B); ms per batch")
    summary, med = {}, []
    for side in sides:
        for p in ("remote", "second"):
            xs = [x for x in rows if x["side"] == side and x["pass"] == p]
            m = {k: float(np.median([x[k] for x in xs])) for k in xs[0] if k.endswith(MEDIANS)}
            m.update(side=side, round="med", missed=sum(x["missed"] for x in xs),
                     bad_pages=sum(x["bad_pages"] for x in xs), **{"pass": p})
            summary[f"{side} {p}"] = m
            med.append(m)
    print_table(med, f"medians of {args.rounds} round(s); 'second': every batch read again "
                "(Fluxon: a local hit on B; Mooncake: remote again)")
    if {"fluxon", "mooncake"} <= set(sides):
        f, m = summary["fluxon remote"], summary["mooncake remote"]
        ratios = {"GB/s": f["GB/s"] / m["GB/s"] if m["GB/s"] else float("nan"),
                  "batch p50": f["batch p50 ms"] / m["batch p50 ms"]}
        if f["missed"] or m["missed"]:  # a batch that missed is not a latency to compare
            ratios["batch p50"] = float("nan")
        summary["fluxon/mooncake remote"] = ratios
        lat = ("n/a (misses)" if ratios["batch p50"] != ratios["batch p50"]
               else f"{ratios['batch p50']:.2f}x (below 1: Fluxon faster)")
        print(f"\nfluxon/mooncake remote: throughput {ratios['GB/s']:.2f}x, batch p50 latency "
              f"{lat}")
    lookups = [x["client_stats"]["lookup_us"] / 1000 / x["client_stats"]["lookup_calls"]
               for x in rows if x.get("client_stats", {}).get("lookup_calls")]
    if lookups:  # owner B's master Lookup, mean per batch, median over the Fluxon rounds
        summary["fluxon lookup ms"] = float(np.median(lookups))
    inside = [x["client_stats"]["deferred_start_us"] / 1000 / x["client_stats"]["deferred_gets"]
              for x in rows if x["side"] == "fluxon-deferred"
              and x.get("client_stats", {}).get("deferred_gets")]
    if inside:  # owner B's own time answering a deferred get_start (its Lookup included)
        summary["fluxon deferred get_start inside owner ms"] = float(np.median(inside))
        print(f"owner B answering a deferred get_start: {np.median(inside):.2f} ms per batch "
              f"(its master Lookup included; the rest of the client's get_start is the socket)")
    if {"fluxon", "fluxon-deferred"} <= set(sides):
        f, d = summary["fluxon remote"], summary["fluxon-deferred remote"]
        summary["deferred/fluxon remote"] = {
            "start p50": d["start p50 ms"] / f["start p50 ms"],
            "batch p50": d["batch p50 ms"] / f["batch p50 ms"]}
        print(f"fluxon-deferred/fluxon remote: get_start p50 {d['start p50 ms']:.2f} / "
              f"{f['start p50 ms']:.2f} ms; batch p50 {d['batch p50 ms']:.2f} / "
              f"{f['batch p50 ms']:.2f} ms; second-pass (local) get_start p50 "
              f"{summary['fluxon-deferred second']['start p50 ms']:.2f} ms" +
              (f"; owner B's master Lookup {summary['fluxon lookup ms']:.2f} ms per batch"
               if lookups else ""))
    if {"fluxon", "fluxon-pipelined"} <= set(sides):
        f, d = summary["fluxon remote"], summary["fluxon-pipelined remote"]
        summary["pipelined/fluxon remote GB/s"] = d["GB/s"] / f["GB/s"] if f["GB/s"] else 0.0
        print(f"fluxon-pipelined/fluxon remote: {d['GB/s']:.2f} / {f['GB/s']:.2f} GB/s = "
              f"{summary['pipelined/fluxon remote GB/s']:.2f}x (the next batch's fetch overlaps "
              "this batch's copy)")
    shares = []
    for x in rows:  # owner B's own split of its remote-get time (warm-up batch included)
        cs = x.get("client_stats") or {}
        c = sum(cs.get(f"remote_{part}_us", 0) for part in ("claim", "start", "finish", "install"))
        r = cs.get("remote_read_us", 0)
        if x["side"].startswith("fluxon") and x["pass"] == "remote" and c + r > 0:
            shares.append(100.0 * c / (c + r))
    if shares:
        summary["fluxon owner control share %"] = float(np.median(shares))
        print(f"fluxon owner B, inside get_start: control path (claims, BatchGetStart, "
              f"BatchGetDone, installs) {np.median(shares):.1f}% of remote-get time, data-plane read "
              f"{100 - np.median(shares):.1f}% (median of {len(shares)} rounds)")
    if getattr(args, "ceilings", None):
        ceiling = float(np.median(args.ceilings))
        summary["transport ceiling GB/s"] = ceiling
        parts = [f"{side} {summary[f'{side} remote']['GB/s'] / ceiling:.0%}"
                 for side in sides if side.startswith("fluxon")]
        for side in sides:
            if side.startswith("fluxon"):
                summary[f"{side} remote / ceiling"] = summary[f"{side} remote"]["GB/s"] / ceiling
        print(f"remote pass against the transport's own ceiling ({ceiling:.2f} GB/s, fluxon-tcp, "
              f"4 connections, median of {len(args.ceilings)} rounds): " + ", ".join(parts))
    missed = sum(x["missed"] for x in rows)
    failed = sum(x["bad_pages"] for x in rows) + sum(x.get("errors", 0) for x in rows)
    if missed:
        print(f"MISSES: {missed} pages not restored (fluxon: remote get not served by this build?)")
    if failed:
        print(f"FAILURES: {failed} (bad pages or errors, see above)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: getattr(args, k) for k in (
                "value_len", "pages_per_batch", "batches", "rounds", "segment", "copy_threads")},
                "rows": rows, "summary": summary}, f, indent=1)
    return 1 if missed or failed else 0


if __name__ == "__main__":
    sys.exit(main())
