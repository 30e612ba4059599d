#!/usr/bin/env python3
"""Fluxon vs Mooncake Store on the same loopback, capacity, keys and page bytes (batch level).

Both systems move pages between one host page pool (a numpy array standing in for SGLang's
pinned host pool) and their stores, the way SGLang's backends drive them:
- Mooncake: register_buffer on the pool, batch_is_exist, batch_put_from, batch_get_into, with a
  real mooncake_master on 127.0.0.1 and the TCP transport;
- Fluxon: get_start (exists/prefix), local_fast_put_start + native copy + local_fast_put_commit,
  get_transfer + native copy + release_views, against an embedded fluxond.
Equal capacity: Mooncake's global segment and Fluxon's owner segment have the same size.

Prints put/get GB/s and pages/s and batch p50/p99, exists latency, and errors.

    pip install mooncake-transfer-engine-non-cuda   # provides mooncake_master
    PYTHONPATH=build/python python3 bench/mooncake_compare.py [--pages-per-batch 128] ...
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import fluxon


def pct(xs, p):
    return float(np.percentile(np.array(xs) * 1e3, p)) if xs else float("nan")


class FluxonSide:
    name = "fluxon"

    def __init__(self, args, tmp):
        self.sock = os.path.join(tmp, "owner.sock")
        cfg = os.path.join(tmp, "fluxond.yaml")
        with open(cfg, "w") as f:
            f.write(f"""
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {self.sock}
  segment: {{size: {args.capacity_bytes}}}
  local_reserve:
    expected_capacity: {{value_len: {args.value_len}, payload_capacity_bytes: {int(args.capacity_bytes * 0.9)}}}
""")
        self.proc = subprocess.Popen([args.fluxond, "--config", cfg], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(400):
            if os.path.exists(self.sock):
                break
            time.sleep(0.05)
        self.c = fluxon.KvClient(socket_path=self.sock)
        # The counterpart of Mooncake's store warm-up: no first-touch faults in the measured copies
        # (an SGLang process gets the same from registering the segment with CUDA).
        self.c.prefault_segment()
        self.value_len = args.value_len
        self.threads = args.copy_threads

    def exists(self, keys):
        h = self.c.get_start(keys)
        n = h.result.raw_prefix_hit_len
        self.c.cancel_get_transfer(h)
        return n

    def put(self, keys, host_ptr, parent=None):
        try:
            # parent: the page before keys[0], as SGLang's backend passes it from prefix_keys.
            plan = self.c.local_fast_put_start(keys, self.value_len,
                                               fluxon.PutOptionalArgs(parent_key=parent))
        except fluxon.KeyConflictError as e:
            # Stored already (as SGLang's backend does): write only the others.
            skip = set(e.conflict_indices)
            rest = [k for i, k in enumerate(keys) if i not in skip]
            return len(skip) + (self.put(rest, host_ptr, parent if 0 not in skip else None)
                                if rest else 0)
        except fluxon.NoSpaceError:
            return 0
        fluxon.copy_to_plan(plan, host_ptr, self.value_len, self.threads)
        self._last = self.c.local_fast_put_commit(plan)
        return len(keys)

    def get(self, keys, host_ptr):
        h = self.c.get_start(keys)
        if h.result.transferable_len == 0:
            self.c.cancel_get_transfer(h)
            return 0
        plan = self.c.get_transfer(h)
        fluxon.copy_from_plan(plan, host_ptr, self.value_len, self.threads)
        self.c.release_views(plan)
        return h.result.transferable_len

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)


class MooncakeSide:
    name = "mooncake"

    def __init__(self, args, pool):
        from mooncake.store import MooncakeDistributedStore
        port = 50071
        master = shutil.which("mooncake_master")
        if master is None:
            raise SystemExit("mooncake_master not found: pip install mooncake-transfer-engine-non-cuda")
        self.proc = subprocess.Popen([master, f"--port={port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        self.s = MooncakeDistributedStore()
        rc = self.s.setup("127.0.0.1", "P2PHANDSHAKE", args.capacity_bytes, 16 << 20, "tcp", "",
                          f"127.0.0.1:{port}")
        if rc != 0:
            raise SystemExit(f"mooncake setup failed: {rc}")
        if self.s.register_buffer(pool.ctypes.data, pool.nbytes) != 0:
            raise SystemExit("mooncake register_buffer failed")
        self.value_len = args.value_len

    def exists(self, keys):
        flags = self.s.batch_is_exist(keys)
        n = 0
        while n < len(flags) and flags[n] == 1:
            n += 1
        return n

    def put(self, keys, host_ptr, parent=None):  # Mooncake has no such hint
        v = self.value_len
        r = self.s.batch_put_from(keys, [host_ptr + i * v for i in range(len(keys))], [v] * len(keys))
        return sum(1 for x in r if x == 0)

    def get(self, keys, host_ptr):
        v = self.value_len
        r = self.s.batch_get_into(keys, [host_ptr + i * v for i in range(len(keys))], [v] * len(keys))
        return sum(1 for x in r if x == v)

    def touch_store(self, batches, pool):
        # Mooncake allocates its segment lazily: write every batch once and remove it, so its
        # first-touch page faults stay out of the figures (Fluxon's prewarm does the same).
        for i in range(batches):
            self.put([f"touch-{i}-{j}" for j in range(len(pool) // 2)], pool.ctypes.data)
        self.s.remove_all()

    def close(self):
        self.s.close()
        self.proc.terminate()
        self.proc.wait(timeout=20)


def run(side, args, pool, out):
    v, b = args.value_len, args.pages_per_batch
    batches = args.batches
    # Warm-up (not measured): one batch each way, so first-touch faults of the destination buffer
    # and of the stores' memory stay out of the figures.
    out.fill(0)
    warm = [f"{side.name}-warm-{j}" for j in range(b)]
    side.put(warm, pool.ctypes.data)
    if side.name == "fluxon":
        try:
            side._last.wait(30)
        except fluxon.KeyConflictError:
            pass  # in a cluster: another location already holds the value (a demoted page)
    side.get(warm, out.ctypes.data)
    if hasattr(side, "touch_store"):
        side.touch_store(batches, pool)
    put_lat, get_lat, ex_lat = [], [], []
    errors = 0
    for i in range(batches):
        keys = [f"{side.name}-{i}-{j}" for j in range(b)]
        t0 = time.perf_counter()
        ok = side.put(keys, pool.ctypes.data + (i % args.pool_batches) * b * v)
        put_lat.append(time.perf_counter() - t0)
        errors += b - ok
    if side.name == "fluxon":
        try:
            side._last.wait(30)
        except fluxon.KeyConflictError:
            pass  # in a cluster: another location already holds the value (a demoted page)
    for i in range(batches):
        keys = [f"{side.name}-{i}-{j}" for j in range(b)]
        t0 = time.perf_counter()
        n = side.exists(keys)
        ex_lat.append(time.perf_counter() - t0)
        errors += b - n
    for i in range(batches):
        keys = [f"{side.name}-{i}-{j}" for j in range(b)]
        t0 = time.perf_counter()
        n = side.get(keys, out.ctypes.data)
        get_lat.append(time.perf_counter() - t0)
        errors += b - n
        src = pool[(i % args.pool_batches) * b:(i % args.pool_batches) * b + b]
        if not np.array_equal(out[:b], src):
            errors += 1
    total = batches * b * v
    return {
        "put GB/s": total / sum(put_lat) / 1e9, "get GB/s": total / sum(get_lat) / 1e9,
        "put pages/s": batches * b / sum(put_lat), "get pages/s": batches * b / sum(get_lat),
        "put p50 ms": pct(put_lat, 50), "put p99 ms": pct(put_lat, 99),
        "get p50 ms": pct(get_lat, 50), "get p99 ms": pct(get_lat, 99),
        "exists p50 ms": pct(ex_lat, 50), "errors": errors,
    }


def chain_keys(session, n, prefix):
    keys, parent = [], "root"
    for i in range(n):
        parent = hashlib.sha1(f"{parent}|{session}|{i}".encode()).hexdigest()[:24]
        keys.append(f"{prefix}:{parent}")
    return keys


def serve_prompt(side, keys, b, pool, out):
    """One prompt as SGLang's HiCache serves it: restore the longest stored prefix (probe, then
    read), back up the rest in batches <= b, each naming the page before it as its parent.
    Returns (pages hit, pages written, pages whose put failed)."""
    prefix = 0
    while prefix < len(keys):
        batch = keys[prefix:prefix + b]
        n = side.exists(batch)
        if n == 0:
            break
        got = side.get(batch[:n], out.ctypes.data)
        prefix += got
        if got < len(batch):
            break
    written = failed = 0
    for i in range(prefix, len(keys), b):
        batch = keys[i:i + b]
        ok = side.put(batch, pool.ctypes.data, keys[i - 1] if i > 0 else None)
        written += ok
        failed += len(batch) - ok
    return prefix, written, failed


def finish_puts(side):
    if side.name == "fluxon":
        try:
            side._last.wait(30)
        except (AttributeError, fluxon.KeyConflictError):
            pass  # no put, or in a cluster another location already holds the value


def multiturn(side, args, pool, out, progress):
    """SGLang's multi-turn HiCache pattern: every turn a session's prompt is its whole context plus
    new pages; restore the longest stored prefix, back up the rest, batches <= pages_per_batch."""
    b = args.pages_per_batch
    # The GPU's time per turn (prefill of the new pages and the decode) between one request's
    # backup and the next request: 0 drives the cache back to back (a stress test).
    turn_s = getattr(args, "turn_ms", 0) / 1e3
    requested = hit = written = failed = 0
    t0 = time.perf_counter()
    for turn in range(args.turns):
        for s in range(args.sessions):
            pages = args.first_turn_pages + turn * args.pages_per_turn
            keys = chain_keys(s, pages, side.name)
            requested += pages
            h, w, f = serve_prompt(side, keys, b, pool, out)
            hit, written, failed = hit + h, written + w, failed + f
            if turn_s:
                time.sleep(turn_s)
            progress.update(1)
    finish_puts(side)
    return {"hit rate %": 100.0 * hit / requested, "pages/s": (hit + written) / (time.perf_counter() - t0),
            "failed puts": failed}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--value-len", type=int, default=4_718_592)
    ap.add_argument("--pages-per-batch", type=int, default=128)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--pool-batches", type=int, default=2, help="host pool size in batches")
    ap.add_argument("--capacity-bytes", type=int, default=4 << 30)
    ap.add_argument("--copy-threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="batch mode: rounds, medians reported")
    ap.add_argument("--fluxond", default=os.environ.get("FLUXOND", "build/src/fluxond"))
    ap.add_argument("--multiturn-capacities", default="",
                    help="comma list of capacities (e.g. 1GiB,2GiB): run the multi-turn hit-rate "
                         "workload at each and write multiturn.png")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-turn-pages", type=int, default=16)
    ap.add_argument("--pages-per-turn", type=int, default=8)
    args = ap.parse_args()
    if args.multiturn_capacities:
        return run_multiturn(args)
    v, b = args.value_len, args.pages_per_batch
    if (args.batches + 1) * b * v > args.capacity_bytes * 0.85:
        raise SystemExit("the batches do not fit the capacity; lower --batches")
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 256, size=(args.pool_batches * b, v), dtype=np.uint8)
    out = np.empty((b, v), dtype=np.uint8)
    # Rounds alternate which system goes first (a noisy VM neighbour or the page cache then
    # favours neither); each figure is the median over rounds, and the ratio of every round is
    # printed too.
    rounds = {"fluxon": [], "mooncake": []}
    for r in range(args.rounds):
        order = ["fluxon", "mooncake"] if r % 2 == 0 else ["mooncake", "fluxon"]
        for name in order:
            tmp = tempfile.mkdtemp(prefix="fxmc", dir="/tmp")
            side = FluxonSide(args, tmp) if name == "fluxon" else MooncakeSide(args, pool)
            try:
                if name == "mooncake":
                    side.s.register_buffer(out.ctypes.data, out.nbytes)
                rounds[name].append(run(side, args, pool, out))
            finally:
                side.close()
                shutil.rmtree(tmp, ignore_errors=True)
        f, m = rounds["fluxon"][-1], rounds["mooncake"][-1]
        print(f"round {r + 1}/{args.rounds}: put {f['put GB/s']:.2f} vs {m['put GB/s']:.2f} GB/s, "
              f"get {f['get GB/s']:.2f} vs {m['get GB/s']:.2f} GB/s", file=sys.stderr)
    results = {n: {k: float(np.median([x[k] for x in rs])) for k in rs[0]}
               for n, rs in rounds.items()}
    print(f"\n{args.batches} batches x {b} pages x {v} B, capacity {args.capacity_bytes} B each, "
          f"loopback; medians of {args.rounds} rounds")
    print(f"| figure | fluxon | mooncake | fluxon / mooncake |\n|---|---|---|---|")
    for k in results["fluxon"]:
        f, m = results["fluxon"][k], results["mooncake"][k]
        if k == "errors":
            print(f"| {k} (sum) | {sum(x[k] for x in rounds['fluxon']):.0f} | "
                  f"{sum(x[k] for x in rounds['mooncake']):.0f} | |")
            continue
        ratio = f / m if ("GB/s" in k or "pages/s" in k) else (m / f if f else float("nan"))
        print(f"| {k} | {f:.3f} | {m:.3f} | {ratio:.2f}x |")
    for k in ("put GB/s", "get GB/s"):
        per = [fx[k] / mc[k] for fx, mc in zip(rounds["fluxon"], rounds["mooncake"])]
        print(f"{k} ratio per round: " + ", ".join(f"{x:.2f}x" for x in per))
    return 0


def run_multiturn(args):
    from tqdm import tqdm
    units = {"GiB": 1 << 30, "MiB": 1 << 20}
    caps = []
    for c in args.multiturn_capacities.split(","):
        num, unit = c[:-3], c[-3:]
        caps.append(int(float(num) * units[unit]))
    b, v = args.pages_per_batch, args.value_len
    pool = np.random.default_rng(7).integers(0, 256, size=(b, v), dtype=np.uint8)
    out = np.empty((b, v), dtype=np.uint8)
    ws = sum(args.first_turn_pages + (args.turns - 1) * args.pages_per_turn for _ in range(args.sessions))
    print(f"working set {ws} pages = {ws * v / 2**30:.2f} GiB")
    rows = []
    for cap in caps:
        args.capacity_bytes = cap
        for make in (lambda: FluxonSide(args, tempfile.mkdtemp(prefix="fxmt", dir="/tmp")),
                     lambda: MooncakeSide(args, pool)):
            side = make()
            if side.name == "mooncake":
                side.s.register_buffer(out.ctypes.data, out.nbytes)
            try:
                with tqdm(total=args.turns * args.sessions, desc=f"{side.name} {cap / 2**30:.1f} GiB",
                          file=sys.stderr) as bar:
                    r = multiturn(side, args, pool, out, bar)
            finally:
                side.close()
            rows.append((cap, side.name, r))
    print("\n| capacity GiB | system | hit rate % | pages/s | failed puts |\n|---|---|---|---|---|")
    for cap, name, r in rows:
        print(f"| {cap / 2**30:.1f} | {name} | {r['hit rate %']:.1f} | {r['pages/s']:.0f} | {r['failed puts']} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        for name in ("fluxon", "mooncake"):
            xs = [c / 2**30 for c, n, _ in rows if n == name]
            ax[0].plot(xs, [r["hit rate %"] for c, n, r in rows if n == name], "o-", label=name)
            ax[1].plot(xs, [r["pages/s"] for c, n, r in rows if n == name], "o-", label=name)
        ax[0].set(xlabel="capacity (GiB)", ylabel="hit rate (%)", title="multi-turn hit rate")
        ax[1].set(xlabel="capacity (GiB)", ylabel="pages/s", title="throughput")
        for a in ax:
            a.legend()
            a.grid(True)
        fig.tight_layout()
        fig.savefig("multiturn.png", dpi=100)
        print("plot: multiturn.png")
    except ImportError:
        print("matplotlib not installed: no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
