#!/usr/bin/env python3
"""Fluxon's TCP transport against Mooncake Transfer Engine over TCP, same loopback, same run.

Read 128 values of 4,718,592 bytes (604 MB per batch) from ANOTHER PROCESS over
127.0.0.1, one batch of 128 descriptors per call, with 1, 2, 4 and 8 connections.

- Fluxon: `build/bench/bench_transport --rounds=1 --batches=1 --connections=C` (TcpTransport
  reading from a `transport_peer` process; its raw-socket ceiling comes along). One invocation
  measures one batch after one warm-up batch; the script runs --batches invocations per round.
- Mooncake: `mooncake.engine.TransferEngine` (pip `mooncake-transfer-engine-non-cuda`), protocol
  "tcp", metadata "P2PHANDSHAKE" (no metadata server). A target process holds the 128 values in
  registered memory; an initiator process reads them with one `batch_transfer_sync_read` of 128
  entries into its own registered buffer. Mooncake's TCP "connections": with
  MC_TCP_ENABLE_CONNECTION_POOL=1 the transport keeps MC_TCP_LANES_PER_PEER fixed connections
  (lanes) per peer, so lanes=C is the equivalent of C connections; its default (pool off) opens
  a new connection per transfer, i.e. 128 at once for this batch, reported as its own row.
  Every Mooncake batch is verified: the destination is poisoned before each timed batch (a byte
  at the start and end of every value) and checked after it, and at the end of each round the
  CRC-32 of the whole destination must equal the target's.

The VM is noisy, so the modes alternate inside every round (order reversed on odd rounds);
GB/s is the median over rounds of (bytes of the round's batches / their time), p50/p99 are over
all batches of all rounds.

    pip install mooncake-transfer-engine-non-cuda
    python3 bench/mooncake_te_compare.py [--rounds 5] [--batches 2] [--connections 1,2,4,8]
"""

import argparse
import ctypes
import json
import mmap
import os
import platform
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import zlib

VALUE = 4_718_592
VALUES = 128
BATCH = VALUE * VALUES


# ---- child roles (run as separate processes) ----------------------------------------------------

def _engine():
    from mooncake.engine import TransferEngine  # imported in the child only
    te = TransferEngine()
    rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise SystemExit(f"TransferEngine.initialize returned {rc}")
    return te


def _buffer():
    buf = mmap.mmap(-1, BATCH, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    ctypes.memset(addr, 0, BATCH)  # fault the pages in before anything is timed
    return buf, addr


def _reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def role_target():
    te = _engine()
    buf, addr = _buffer()
    for i in range(VALUES):  # random bytes, different in every value
        buf[i * VALUE:(i + 1) * VALUE] = os.urandom(VALUE)
    if te.register_memory(addr, BATCH) != 0:
        raise SystemExit("register_memory failed on the target")
    _reply({"port": te.get_rpc_port(), "addr": addr, "crc": zlib.crc32(buf)})
    sys.stdin.read()  # until the parent closes stdin (or dies)


def role_initiator(target, raddr, crc):
    te = _engine()
    buf, addr = _buffer()
    if te.register_memory(addr, BATCH) != 0:
        raise SystemExit("register_memory failed on the initiator")
    local = [addr + i * VALUE for i in range(VALUES)]
    remote = [raddr + i * VALUE for i in range(VALUES)]
    lens = [VALUE] * VALUES
    _reply({"ready": True})

    def batch():
        t0 = time.perf_counter()
        rc = te.batch_transfer_sync_read(target, local, remote, lens)
        dt = time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"batch_transfer_sync_read returned {rc}")
        return dt

    for line in sys.stdin:
        n = int(line)
        ctypes.memset(addr, 0, BATCH)
        batch()  # warm-up (connections, lanes)
        expect = [(buf[i * VALUE], buf[(i + 1) * VALUE - 1]) for i in range(VALUES)]
        times = []
        for _ in range(n):
            for i in range(VALUES):  # poison: the batch must rewrite every value's ends
                buf[i * VALUE] = expect[i][0] ^ 0xFF
                buf[(i + 1) * VALUE - 1] = expect[i][1] ^ 0xFF
            times.append(batch())
            got = [(buf[i * VALUE], buf[(i + 1) * VALUE - 1]) for i in range(VALUES)]
            if got != expect:
                raise SystemExit("a timed batch left poisoned bytes: the bytes did not move")
        ok = zlib.crc32(buf) == crc
        _reply({"times": times, "crc_ok": ok})
        if not ok:
            raise SystemExit("destination CRC-32 differs from the target's")


# ---- parent ---------------------------------------------------------------------------------------

class Child:
    """A child process speaking one JSON line per request on stdout; every read is bounded."""

    def __init__(self, argv, env, log_path, timeout):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.timeout = timeout
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, start_new_session=True)

    def request(self, line=None):
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        out = self.proc.stdout.readline() if ready else ""
        if not out:
            self.close()
            with open(self.log_path) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"{self.proc.args[2:]} gave no answer within {self.timeout} s "
                               f"(rc={self.proc.poll()}); its log:\n{tail}")
        return json.loads(out)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.log.close()


def mooncake_env(pool, lanes, slice_bytes):
    env = dict(os.environ)
    env["MC_TCP_ENABLE_CONNECTION_POOL"] = "1" if pool else "0"
    if lanes:
        env["MC_TCP_LANES_PER_PEER"] = str(lanes)
    if slice_bytes:
        env["MC_TCP_SLICE_SIZE"] = str(slice_bytes)
    return env


ROW = re.compile(r"^\| (fluxon-tcp|raw-tcp|memcpy) \| (\d+) \| [\d.]+ \| ([\d.]+) \|")


def fluxon_batch(bench, conns, timeout):
    """One bench_transport invocation: seconds of one fluxon-tcp batch and one raw-tcp batch."""
    r = subprocess.run([bench, "--rounds=1", "--batches=1", f"--connections={conns}"],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"bench_transport rc={r.returncode}: {r.stderr[-2000:]}")
    got = {}
    for line in r.stdout.splitlines():
        m = ROW.match(line)
        if m:
            got[m.group(1)] = float(m.group(3)) / 1e3  # p50 of one batch = that batch
    if "fluxon-tcp" not in got or "raw-tcp" not in got:
        raise RuntimeError(f"unexpected bench_transport output:\n{r.stdout}")
    return got


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))] if xs else float("nan")


def median(xs):
    return pct(xs, 0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=2, help="timed batches per mode per round")
    ap.add_argument("--connections", default="1,2,4,8")
    ap.add_argument("--bench", default="build/bench/bench_transport")
    ap.add_argument("--no-mooncake-default", action="store_true",
                    help="skip Mooncake's default configuration (pool off)")
    ap.add_argument("--mooncake-slice-bytes", type=int, default=0,
                    help="MC_TCP_SLICE_SIZE for Mooncake (0: its default, 64 KiB)")
    ap.add_argument("--timeout", type=float, default=300, help="bound on every child's answer, s")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--raddr", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--crc", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "target":
        return role_target()
    if a.role == "initiator":
        return role_initiator(a.target, a.raddr, a.crc)

    conns = [int(c) for c in a.connections.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` reaps the children
    if not os.access(a.bench, os.X_OK):
        raise SystemExit(f"{a.bench} not found: cmake --build build --target bench_transport")
    try:
        import mooncake.engine  # noqa: F401  (fail early, before anything starts)
    except ImportError as e:
        raise SystemExit(f"{e}: pip install mooncake-transfer-engine-non-cuda")
    mc_version = "unknown"
    try:
        from importlib.metadata import version
        mc_version = version("mooncake-transfer-engine-non-cuda")
    except Exception:
        pass

    me = [sys.executable, os.path.abspath(__file__)]
    logdir = tempfile.mkdtemp(prefix="mooncake-te-")
    children = []
    configs = [(f"lanes={c}", True, c) for c in conns]
    if not a.no_mooncake_default:
        configs.append(("default", False, 0))
    samples = {}  # (system, config) -> list of per-round lists of batch seconds
    ok = False
    try:
        env = mooncake_env(True, 0, a.mooncake_slice_bytes)
        target = Child(me + ["--role=target"], env, f"{logdir}/target.log", a.timeout)
        children.append(target)
        t = target.request()
        inits = {}
        for name, pool, lanes in configs:
            ch = Child(me + ["--role=initiator", f"--target=127.0.0.1:{t['port']}",
                             f"--raddr={t['addr']}", f"--crc={t['crc']}"],
                       mooncake_env(pool, lanes, a.mooncake_slice_bytes),
                       f"{logdir}/initiator-{name}.log", a.timeout)
            children.append(ch)
            ch.request()
            inits[name] = ch

        for rnd in range(a.rounds):
            steps = []
            for c in conns:
                steps.append(("fluxon", c))
                steps.append(("mooncake", f"lanes={c}"))
            if not a.no_mooncake_default:
                steps.append(("mooncake", "default"))
            if rnd % 2:
                steps.reverse()
            for system, key in steps:
                if system == "fluxon":
                    fl, raw = [], []
                    for _ in range(a.batches):
                        got = fluxon_batch(a.bench, key, a.timeout)
                        fl.append(got["fluxon-tcp"])
                        raw.append(got["raw-tcp"])
                    samples.setdefault(("fluxon", key), []).append(fl)
                    samples.setdefault(("raw", key), []).append(raw)
                else:
                    r = inits[key].request(str(a.batches))
                    if not r["crc_ok"]:
                        raise RuntimeError(f"mooncake {key}: destination CRC mismatch")
                    samples.setdefault(("mooncake", key), []).append(r["times"])
            print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr, flush=True)
        ok = True
    finally:
        for ch in reversed(children):
            ch.close()
        if not ok:
            print(f"failed; the children's logs are in {logdir}", file=sys.stderr)
    for f in os.listdir(logdir):  # logs are kept only when something failed
        os.unlink(os.path.join(logdir, f))
    os.rmdir(logdir)

    def stats(k):
        rounds = samples[k]
        gbps = median([len(r) * BATCH / sum(r) / 1e9 for r in rounds])
        flat = [x for r in rounds for x in r]
        return gbps, 1e3 * pct(flat, 0.5), 1e3 * pct(flat, 0.99), len(flat)

    print(f"read of {VALUES} x {VALUE} B = {BATCH / 1e6:.1f} MB per batch over 127.0.0.1, "
          f"{a.rounds} rounds x {a.batches} batches per mode; mooncake-transfer-engine-non-cuda "
          f"{mc_version}, protocol tcp, P2PHANDSHAKE, MC_TCP_SLICE_SIZE="
          f"{a.mooncake_slice_bytes or 'default (64 KiB)'}; {platform.node()} "
          f"{os.cpu_count()} CPUs; Mooncake bytes verified (poison + CRC-32)")
    print("| connections | Fluxon GB/s | Mooncake GB/s | Fluxon / Mooncake | Fluxon p50 / p99 ms "
          "| Mooncake p50 / p99 ms | raw-tcp GB/s |")
    print("|---|---|---|---|---|---|---|")
    for c in conns:
        f, m, r = stats(("fluxon", c)), stats(("mooncake", f"lanes={c}")), stats(("raw", c))
        print(f"| {c} (Mooncake lanes={c}) | {f[0]:.2f} | {m[0]:.2f} | {f[0] / m[0]:.2f}x "
              f"| {f[1]:.1f} / {f[2]:.1f} | {m[1]:.1f} / {m[2]:.1f} | {r[0]:.2f} |")
    if not a.no_mooncake_default:
        m = stats(("mooncake", "default"))
        best = max(stats(("fluxon", c))[0] for c in conns)
        print(f"| Mooncake default (pool off: a connection per value, {VALUES} at once) | – "
              f"| {m[0]:.2f} | best Fluxon {best:.2f} = {best / m[0]:.2f}x | – "
              f"| {m[1]:.1f} / {m[2]:.1f} | – |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
