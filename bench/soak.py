#!/usr/bin/env python3
"""Soak test: an embedded fluxond under mixed traffic, faults, kills and capacity pressure.

Starts its own fluxond (private socket, admin on a free port, short handle TTL, small segment so
eviction runs), then for --duration runs --workers processes (multiprocessing spawn) doing:

  * puts of 1..64 pages per batch continuing per-session chains (parent_key), sometimes with
    atomic groups, sometimes aborted, sometimes re-writing pages already written (conflicts);
    commit futures are waited for with a timeout or reaped later;
  * get_start -> get_transfer (sometimes a shorter consume_prefix_len on a group boundary) ->
    copy_from_plan -> byte-exact verification -> release_views; sometimes cancel_get_transfer;
    sometimes a handle is abandoned to the daemon's handle TTL (and checked to be gone after it);
    some gets read another worker's sessions;
  * delete_prefix of one session or of the worker's whole namespace;

while the parent SIGKILLs a worker mid-batch every --kill-interval (and starts a replacement that
resumes its sessions) and injects faults into master calls with fluxonctl every --fault-interval
(drop / delay / fail / duplicate on master.PublishBatch, master.Lookup, master.RemoveRoutes),
clearing each after --fault-hold.

Every value is a pure function of its key, so any process can verify any restored page.

Every --report-interval a progress line is printed. After the traffic stops the soak waits (at
most --settle-timeout) for the daemon's temporary counters (`fluxonctl --json stats`) to return
to their pre-traffic values and for the master's route count to equal the owner's committed
values, compares the daemon's RSS (VmRSS, and VmRSS - RssShmem: the part that is not the shared
segment) with its RSS after --warmup (allowed: +--rss-tolerance, +--rss-slack), and prints a
summary table (Markdown, for docs/perf.md). Exit status 0 when everything passed; 1 on any byte
mismatch, unexpected exception, counter not back at baseline, RSS growth over the allowance, stuck
worker, fluxonctl failure, daemon crash or interruption (Ctrl-C stops the traffic early and still
runs the checks; a second Ctrl-C aborts); 2 on a usage error or when the daemon cannot start.

Needs a build (build/src/fluxond, build/src/fluxonctl) and the fluxon package (PYTHONPATH=
build/python, or a venv with the wheel; build/python is tried when fluxon is not importable).

    python3 bench/soak.py --duration 30m
    python3 bench/soak.py --duration 3m --fault-interval 15s --kill-interval 20s
    python3 bench/soak.py --write-config /tmp/soak.yaml   # only write the daemon config
    python3 bench/soak.py --cluster --duration 3m         # cluster mode (bench/soak_cluster.py)
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import multiprocessing as mp
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Counters that must be back at their pre-traffic value once the traffic has stopped (names as
# `fluxonctl --json stats` prints them: owner counters carry the "owner_" prefix).
BASELINE_COUNTERS = (
    "owner_prepared_puts",
    "owner_reserved_entries",
    "owner_slots_Prepared",
    "owner_slots_Pending",
    "owner_slots_PendingLocalVisible",
    "owner_slots_Releasing",
    "owner_local_visible_entries",
    "owner_live_handles",
    "owner_live_views",
    "owner_inflight_gets",
    "owner_publish_queue",
    "owner_client_sessions",
)
# Once settled these are equal: every committed value has exactly one master route.
ROUTE_COUNTERS = ("owner_keys", "owner_committed_entries", "master_routes")
# Client-side counters each worker checks in its own client.stats() after draining.
CLIENT_COUNTERS = ("client_active_plans", "client_handles", "client_pending_futures")

# (operation, exception class name) pairs that are expected under faults and pressure: counted,
# not failures. Anything else raised by a live worker is a failure.
EXPECTED_ERRORS = {
    ("put_start", "KeyConflictError"),      # another writer / a page kept by delete_prefix
    ("put_start", "NoSpaceError"),          # capacity pressure: the bounded claim wait ran out
    ("rewrite_start", "KeyConflictError"),  # re-writing pages that are still stored
    ("rewrite_start", "NoSpaceError"),
    ("future_wait", "TimeoutError"),        # publish delayed by an injected fault
    ("future", "KeyConflictError"),         # superseded by another writer's publish
}

# Fault rotation: (point, action, delay_ms, count).
FAULTS = (
    ("master.PublishBatch", "drop", 0, 3),
    ("master.Lookup", "delay", 50, 50),
    ("master.RemoveRoutes", "drop", 0, 3),
    ("master.PublishBatch", "delay", 1500, 6),  # ~9 s publish stall: futures time out
    ("master.Lookup", "drop", 0, 3),
    ("master.RemoveRoutes", "delay", 200, 10),
    ("master.PublishBatch", "fail", 0, 3),
    ("master.Lookup", "fail", 0, 3),
    ("master.RemoveRoutes", "fail", 0, 3),
    ("master.PublishBatch", "duplicate", 0, 5),
    ("master.Lookup", "duplicate", 0, 5),
    ("master.RemoveRoutes", "duplicate", 0, 3),
)

# Worker phases (shared with the parent so a kill lands mid-batch).
PH_IDLE, PH_PUT, PH_HANDLE, PH_VIEWS, PH_DRAIN = 0, 1, 2, 3, 4
PHASE_NAMES = {PH_IDLE: "idle", PH_PUT: "put-prepared", PH_HANDLE: "handle-held",
               PH_VIEWS: "views-held", PH_DRAIN: "draining"}

SESSIONS = 8          # chains per worker
MUL = 0xBF58476D1CE4E5B9  # odd: page word i = (i ^ h(key)) * MUL mod 2^64
MUL_INV = pow(MUL, -1, 1 << 64)
MASK64 = (1 << 64) - 1


# ------------------------------------------------------------------------------------------------
# Small helpers


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (e.g. 90s, 30m, 1.5h, 500ms)")
    v, unit = float(m.group(1)), (m.group(2) or "s")
    return v * {"ms": 1e-3, "s": 1, "m": 60, "min": 60, "h": 3600}[unit]


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 256KiB, 2GiB, 1.5GB, 4096)")
    v, unit = float(m.group(1)), (m.group(2) or "B").upper()
    mult = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
            "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}[unit]
    return int(v * mult)


def fmt_bytes(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def fmt_secs(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_pdeathsig() -> None:
    """Dies with the parent (PR_SET_PDEATHSIG), so nothing outlives a killed soak."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def read_rss(pid: int) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def page_key(ns: str, session: int, epoch: int, index: int) -> str:
    return f"{ns}/s{session}.{epoch}/p{index}"


def random_groups(rng: random.Random, n: int) -> list:
    groups, left = [], n
    while left:
        g = rng.randint(1, min(left, 8))
        groups.append(g)
        left -= g
    return groups


def make_config(sock: str, admin_port: int, segment: int, handle_ttl_ms: int,
                claim_timeout_ms: int, allow_mutations: bool = True) -> str:
    """The soak daemon's config (also what --write-config writes)."""
    admin = f'listen_address: "127.0.0.1:{admin_port}", metrics_port: 0'
    if allow_mutations:
        admin += ", allow_mutations: true"
    return f"""# fluxond config generated by bench/soak.py
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{{admin}}}
owner:
  socket_path: {sock}
  segment: {{size: {segment}}}
  local_reserve: {{claim_soft_timeout_ms: 5, claim_hard_timeout_ms: {claim_timeout_ms}}}
  eviction_interval_ms: 50
  handle_ttl_ms: {handle_ttl_ms}
"""


# ------------------------------------------------------------------------------------------------
# Worker process


class Worker:
    def __init__(self, spec: dict, phase, session_arrays):
        import numpy as np

        import fluxon
        self.np, self.fx = np, fluxon
        self.spec = spec
        self.slot, self.gen = spec["slot"], spec["gen"]
        self.ns = f"w{self.slot}"
        self.phase = phase
        self.arrays = session_arrays
        self.mine = session_arrays[self.slot]
        self.rng = random.Random(spec["seed"])
        self.v = spec["value_len"]
        self.words = self.v // 8
        self.threads = spec["copy_threads"]
        self.ttl = spec["handle_ttl_ms"] / 1000.0
        self.max_pages = spec["session_pages"]
        self.idx = np.arange(self.words, dtype=np.uint64)
        self.mul = np.uint64(MUL)
        self.stage = np.empty((64, self.words), dtype=np.uint64)
        self.expect = np.empty((64, self.words), dtype=np.uint64)
        self.out = np.empty((64, self.words), dtype=np.uint64)
        self.ops: dict = {}
        self.errors: dict = {}
        self.unexpected: list = []
        self.unexpected_count = 0
        self.unexpected_by: dict = {}
        self.mismatches: list = []
        self.mismatch_count = 0
        self.verified_bytes = 0
        self.pending: list = []     # commit futures not settled yet
        self.abandoned: list = []   # (time, handle) left to the handle TTL
        self.stats_path = Path(spec["stats_dir"]) / f"w{self.slot}-g{self.gen}.json"
        self.last_flush = 0.0
        self.client_end: dict = {}
        self.client = fluxon.KvClient(socket_path=spec["socket"])
        self.client.wait_local_segments_ready()

    # -- bookkeeping ------------------------------------------------------------------------------
    def count(self, name: str, n: int = 1) -> None:
        self.ops[name] = self.ops.get(name, 0) + n

    def error(self, op: str, e: BaseException) -> None:
        name = type(e).__name__
        key = f"{op}:{name}"
        if (op, name) in EXPECTED_ERRORS:
            self.errors[key] = self.errors.get(key, 0) + 1
            return
        self.unexpected_count += 1
        self.unexpected_by[key] = self.unexpected_by.get(key, 0) + 1
        if len(self.unexpected) < 20:
            here = [f for f in traceback.extract_tb(e.__traceback__)
                    if f.filename.endswith("soak.py")]
            where = f" (soak.py:{here[-1].lineno} in {here[-1].name})" if here else ""
            self.unexpected.append(f"{key}: {e}{where}")
        self.flush(force=True)
        time.sleep(0.05)  # do not spin if the daemon is gone

    def fail(self, what: str) -> None:
        """A contract violation that is not an exception."""
        self.unexpected_count += 1
        key = what.split(":", 1)[0]
        self.unexpected_by[key] = self.unexpected_by.get(key, 0) + 1
        if len(self.unexpected) < 20:
            self.unexpected.append(what)
        self.flush(force=True)

    def flush(self, force: bool = False, done: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_flush < 0.5:
            return
        self.last_flush = now
        doc = {"slot": self.slot, "gen": self.gen, "pid": os.getpid(), "done": done,
               "ops": self.ops, "errors": self.errors, "unexpected": self.unexpected,
               "unexpected_count": self.unexpected_count,
               "unexpected_by": self.unexpected_by, "mismatches": self.mismatches,
               "mismatch_count": self.mismatch_count, "verified_bytes": self.verified_bytes,
               "client_end": self.client_end}
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.stats_path)  # atomic: a SIGKILL never leaves a torn file

    # -- sessions ---------------------------------------------------------------------------------
    def session(self, k: int, arr=None):
        arr = self.mine if arr is None else arr
        return int(arr[2 * k]), int(arr[2 * k + 1])

    def set_session(self, k: int, epoch: int, cursor: int) -> None:
        self.mine[2 * k + 1] = cursor
        self.mine[2 * k] = epoch

    # -- data -------------------------------------------------------------------------------------
    def fill(self, buf, keys) -> None:
        np = self.np
        hs = np.array([key_hash(k) for k in keys], dtype=np.uint64)
        n = len(keys)
        np.bitwise_xor(self.idx[None, :], hs[:, None], out=buf[:n])
        np.multiply(buf[:n], self.mul, out=buf[:n])

    def verify(self, keys, n: int, where: str) -> None:
        np = self.np
        if n == 0:
            return
        self.fill(self.expect, keys[:n])
        if np.array_equal(self.out[:n], self.expect[:n]):
            self.verified_bytes += n * self.v
            self.count("pages_verified", n)
            return
        bad = [i for i in range(n) if not np.array_equal(self.out[i], self.expect[i])]
        self.mismatch_count += len(bad)
        hashes = {key_hash(k): k for k in keys}
        for i in bad[:5]:
            if len(self.mismatches) >= 20:
                break
            diff = np.nonzero(self.out[i] != self.expect[i])[0]
            h_seen = (int(self.out[i][0]) * MUL_INV) & MASK64
            owner = hashes.get(h_seen, "an unknown key")
            self.mismatches.append(
                f"{where}: key {keys[i]!r} (index {i} of {len(keys)}): {len(diff)} of "
                f"{self.words} words differ, first at byte {int(diff[0]) * 8}; "
                f"word 0 looks like {owner}")
        self.flush(force=True)

    # -- operations -------------------------------------------------------------------------------
    def op_put(self, rewrite: bool = False) -> None:
        fx, rng = self.fx, self.rng
        k = rng.randrange(SESSIONS)
        epoch, cursor = self.session(k)
        if rewrite:
            if cursor == 0:
                return
            a = rng.randrange(cursor)
            n = rng.randint(1, min(64, cursor - a))
        else:
            if cursor >= self.max_pages:  # retire the chain, start a new one
                epoch, cursor = epoch + 1, 0
                self.set_session(k, epoch, cursor)
                self.count("sessions_rotated")
            a, n = cursor, rng.randint(1, 64)
        keys = [page_key(self.ns, k, epoch, a + i) for i in range(n)]
        groups = random_groups(rng, n) if rng.random() < 0.3 else None
        parent = page_key(self.ns, k, epoch, a - 1) if a > 0 and rng.random() < 0.9 else None
        op = "rewrite_start" if rewrite else "put_start"
        self.count("rewrite" if rewrite else "put")
        try:
            plan = self.client.local_fast_put_start(
                keys, self.v, fx.PutOptionalArgs(atomic_group_lens=groups, parent_key=parent))
        except Exception as e:
            self.error(op, e)
            if not rewrite and isinstance(e, fx.KeyConflictError):
                self.set_session(k, epoch, a + n)  # those pages exist or are being written
            return
        self.phase.value = PH_PUT
        stage = "put_copy"
        try:
            self.fill(self.stage, keys)
            fx.copy_to_plan(plan, self.stage.ctypes.data, self.v, self.threads)
            if rng.random() < 0.05:
                stage = "put_abort"
                self.client.put_abort(plan)
                self.count("put_abort")
                return
            stage = "put_commit"
            fut = self.client.local_fast_put_commit(plan)
            self.count("commit")
            self.count("pages_put", n)
            if groups:
                self.count("put_grouped")
            if not rewrite:
                self.set_session(k, epoch, a + n)
        except Exception as e:
            self.error(stage, e)
            if stage == "put_copy":
                try:
                    self.client.put_abort(plan)
                except Exception as e2:
                    self.error("put_abort_cleanup", e2)
            return
        finally:
            self.phase.value = PH_IDLE
        if rng.random() < 0.6:
            self.wait_future(fut, timeout=5.0)
        else:
            self.pending.append(fut)

    def wait_future(self, fut, timeout: float) -> bool:
        """Settles fut within timeout; False (and fut kept pending) when it is not done yet."""
        try:
            fut.wait(timeout=timeout)
            self.count("future_ok")
            return True
        except self.fx.TimeoutError as e:
            if not fut.done():
                self.error("future_wait", e)
                self.pending.append(fut)
                return False
            self.error("future", e)
        except Exception as e:
            self.error("future", e)
        return True

    def reap(self, block: bool = False) -> None:
        keep = []
        for fut in self.pending:
            if fut.done():
                exc = fut.exception()
                if exc is None:
                    self.count("future_ok")
                else:
                    self.error("future", exc)
            else:
                keep.append(fut)
        self.pending = keep
        while len(self.pending) > 256 or (block and self.pending):
            fut = self.pending.pop(0)
            self.wait_future(fut, timeout=5.0)
            if block and time.monotonic() > self.drain_deadline:
                break
        now = time.monotonic()
        while self.abandoned and now - self.abandoned[0][0] > self.ttl + 3.0:
            _, h = self.abandoned.pop(0)
            self.check_expired(h)

    def check_expired(self, h) -> None:
        """An abandoned handle must be gone after the TTL (get_transfer: NotFoundError)."""
        try:
            plan = self.client.get_transfer(h)
        except self.fx.NotFoundError:
            self.count("abandon_expired")
            return
        except Exception as e:
            self.error("abandon_check", e)
            return
        self.fail(f"abandon_check: handle still usable {self.ttl + 3:.1f} s after get_start "
                  f"(handle_ttl {self.ttl:.1f} s)")
        try:
            self.client.release_views(plan)
        except Exception as e:
            self.error("release_views", e)

    def op_get(self, cross: bool = False) -> None:
        rng = self.rng
        if cross and len(self.arrays) > 1:
            slot = rng.choice([s for s in range(len(self.arrays)) if s != self.slot])
            ns, arr = f"w{slot}", self.arrays[slot]
        else:
            ns, arr, cross = self.ns, self.mine, False
        k = rng.randrange(SESSIONS)
        epoch, cursor = self.session(k, arr)
        if cursor == 0:
            return
        start = 0 if rng.random() < 0.8 else rng.randrange(cursor)
        n = rng.randint(1, min(64, cursor - start))
        keys = [page_key(ns, k, epoch, start + i) for i in range(n)]
        groups = random_groups(rng, n) if rng.random() < 0.3 else None
        self.count("get_cross" if cross else "get")
        try:
            h = self.client.get_start(keys, atomic_group_lens=groups)
        except Exception as e:
            self.error("get_start", e)
            return
        r = h.result
        t = r.transferable_len
        bounds = [0]
        for g in groups or [1] * n:
            bounds.append(bounds[-1] + g)
        if not (0 <= t <= r.raw_prefix_hit_len <= n) or t not in bounds or \
                (r.all_hit and r.raw_prefix_hit_len != n):
            self.fail(f"get_start result inconsistent for {n} keys, groups {groups}: {r}")
        self.count("get_pages_requested", n)
        self.count("get_pages_hit", t)
        self.phase.value = PH_HANDLE
        plan = None
        try:
            if t == 0 or rng.random() < 0.08:
                self.client.cancel_get_transfer(h)
                self.count("cancel")
                return
            if rng.random() < 0.03:
                self.abandoned.append((time.monotonic(), h))
                self.count("abandon")
                return
            consume = None
            cand = [b for b in bounds if 0 < b < t]
            if cand and rng.random() < 0.3:
                consume = rng.choice(cand)
                self.count("consume_prefix")
            plan = self.client.get_transfer(h, consume_prefix_len=consume)
            m = t if consume is None else consume
            self.phase.value = PH_VIEWS
            ptrs = self.fx.plan_value_ptrs(plan)
            if len(ptrs) != m:
                self.fail(f"get_transfer plan has {len(ptrs)} values, expected {m}")
                m = min(m, len(ptrs))
            self.fx.copy_from_plan(plan, self.out.ctypes.data, self.v, self.threads)
            self.verify(keys, m, f"get {'cross ' if cross else ''}{ns}")
            if rng.random() < 0.05:
                time.sleep(rng.random() * 0.02)  # hold the views a little (pins vs eviction)
            p, plan = plan, None
            self.client.release_views(p)
            self.count("release")
        except Exception as e:
            self.error("get_transfer" if plan is None else "get_copy", e)
            if plan is not None:
                try:
                    self.client.release_views(plan)
                except Exception as e2:
                    self.error("release_cleanup", e2)
        finally:
            self.phase.value = PH_IDLE

    def op_delete(self, whole_ns: bool) -> None:
        if whole_ns:
            prefix = f"{self.ns}/"
        else:
            k = self.rng.randrange(SESSIONS)
            epoch, _ = self.session(k)
            prefix = f"{self.ns}/s{k}.{epoch}/"
        try:
            deleted, kept = self.client.delete_prefix(prefix)
        except Exception as e:
            self.error("delete_prefix", e)
            return
        self.count("delete_ns" if whole_ns else "delete_session")
        self.count("pages_deleted", deleted)
        self.count("pages_kept_in_use", kept)
        for j in range(SESSIONS) if whole_ns else [k]:
            epoch, _ = self.session(j)
            self.set_session(j, epoch, 0)

    # -- main loop --------------------------------------------------------------------------------
    def run(self, stop) -> None:
        rng = self.rng
        self.count("started")
        self.flush(force=True)
        while not stop.is_set():
            x = rng.random()
            if x < 0.40:
                self.op_put()
            elif x < 0.44:
                self.op_put(rewrite=True)
            elif x < 0.88:
                self.op_get()
            elif x < 0.988:
                self.op_get(cross=True)
            elif x < 0.998:
                self.op_delete(whole_ns=False)
            else:
                self.op_delete(whole_ns=True)
            self.reap()
            self.flush()
        # Drain: settle futures, let abandoned handles expire and check them, report.
        self.phase.value = PH_DRAIN
        self.drain_deadline = time.monotonic() + 20.0
        self.reap(block=True)
        if self.pending:
            self.fail(f"{len(self.pending)} commit futures not settled 20 s after the traffic")
        if self.abandoned:
            wait = self.abandoned[-1][0] + self.ttl + 3.0 - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, self.ttl + 3.0))
            for _, h in self.abandoned:
                self.check_expired(h)
            self.abandoned = []
        try:
            s = self.client.stats()
            self.client_end = {c: s.get(c) for c in CLIENT_COUNTERS}
            for c in CLIENT_COUNTERS:
                if c not in s:
                    self.fail(f"client.stats() has no {c}")
                elif s[c] != 0:
                    self.fail(f"client-side {c} = {s[c]} after draining (expected 0)")
        except Exception as e:
            self.error("client_stats", e)
        self.flush(force=True, done=True)


def worker_main(spec: dict, phase, session_arrays, stop) -> None:
    set_pdeathsig()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    w = None
    try:
        w = Worker(spec, phase, session_arrays)
        w.run(stop)
    except BaseException as e:  # noqa: BLE001 - reported to the parent through the stats file
        if w is None:
            path = Path(spec["stats_dir"]) / f"w{spec['slot']}-g{spec['gen']}.json"
            path.write_text(json.dumps({"slot": spec["slot"], "gen": spec["gen"], "done": False,
                                        "unexpected_count": 1,
                                        "unexpected": [f"worker start: {type(e).__name__}: {e}"]}))
        else:
            w.unexpected_count += 1
            w.unexpected.append(f"worker crashed: {type(e).__name__}: {e} | "
                                f"{traceback.format_exc()[-600:]}")
            w.flush(force=True)
        os._exit(3)
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# Parent: the daemon, fluxonctl, kills, faults, reports, checks


class Daemon:
    def __init__(self, args, tmp: Path):
        self.args = args
        self.tmp = tmp
        self.sock = str(tmp / "owner.sock")
        self.log = tmp / "fluxond.log"
        self.proc = None
        self.notes = []
        self.admin_port = 0

    def start(self) -> None:
        a = self.args
        allow = True
        for attempt in range(4):
            self.admin_port = free_port()
            cfg = make_config(self.sock, self.admin_port, a.segment, a.handle_ttl_ms,
                              a.claim_timeout_ms, allow_mutations=allow)
            self.config = self.tmp / "fluxond.yaml"
            self.config.write_text(cfg)
            self.proc = subprocess.Popen([a.fluxond, "--config", str(self.config)],
                                         stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=set_pdeathsig,
                                         start_new_session=True)  # no terminal SIGINT
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                text = self.log.read_text(errors="replace")
                if " ready" in text:
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
            text = self.log.read_text(errors="replace")
            if self.proc.poll() is None:
                self.stop()
                raise RuntimeError(f"fluxond did not become ready in 20 s:\n{text}")
            if allow and "allow_mutations" in text:
                allow = False
                self.notes.append("this fluxond rejects admin.allow_mutations (unknown key): "
                                  "started without it")
                continue
            if "address" in text.lower() and "use" in text.lower():
                continue  # the free port was taken meanwhile: pick another
            raise RuntimeError(f"fluxond exited with {self.proc.returncode}:\n{text}")
        raise RuntimeError(f"fluxond could not start:\n{self.log.read_text(errors='replace')}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0):
        """Returns (returncode, how)."""
        if self.proc is None:
            return None, "not started"
        if self.proc.poll() is not None:
            return self.proc.returncode, "had exited"
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
            return self.proc.returncode, "SIGTERM"
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return self.proc.returncode, f"SIGKILL after {timeout:.0f} s"

    def ctl(self, *argv, json_out: bool = True, timeout: float = 10.0):
        cmd = [self.args.fluxonctl, "--admin", f"127.0.0.1:{self.admin_port}"]
        if json_out:
            cmd.append("--json")
        cmd += list(argv)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[3:])}: exit {r.returncode}: "
                               f"{(r.stderr or r.stdout).strip()}")
        return json.loads(r.stdout) if json_out else r.stdout

    def stats(self) -> dict:
        return self.ctl("stats")


class Soak:
    def __init__(self, args):
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="fxsoak", dir="/tmp"))
        self.stats_dir = self.tmp / "workers"
        self.stats_dir.mkdir()
        self.daemon = Daemon(args, self.tmp)
        self.ctx = mp.get_context("spawn")
        self.stop_evt = self.ctx.Event()
        self.arrays = [self.ctx.Array("q", 2 * SESSIONS, lock=False) for _ in range(args.workers)]
        self.procs = [None] * args.workers   # (Process, phase Value, gen)
        self.gens = [0] * args.workers
        self.rng = random.Random(args.seed)
        self.failures: list = []
        self.notes: list = []
        self.kills: dict = {}
        self.faults_set: list = []       # (point, action, delay_ms, count, fired)
        self.fault_errors = 0
        self.active_fault = None         # (point, action, delay_ms, count, clear_at)
        self.fault_i = 0
        self.worker_exits: list = []
        self.interrupted = False

    # -- workers ----------------------------------------------------------------------------------
    def spawn(self, slot: int) -> None:
        gen = self.gens[slot]
        self.gens[slot] += 1
        spec = {"slot": slot, "gen": gen, "socket": self.daemon.sock,
                "stats_dir": str(self.stats_dir), "value_len": self.args.value_len,
                "copy_threads": self.args.copy_threads, "handle_ttl_ms": self.args.handle_ttl_ms,
                "session_pages": self.args.session_pages,
                "seed": self.rng.randrange(1 << 62)}
        phase = self.ctx.Value("i", PH_IDLE, lock=False)
        p = self.ctx.Process(target=worker_main, args=(spec, phase, self.arrays, self.stop_evt),
                             name=f"soak-w{slot}g{gen}", daemon=True)
        p.start()
        self.procs[slot] = (p, phase, gen)

    def kill_one(self) -> None:
        live = [s for s, e in enumerate(self.procs) if e and e[0].is_alive()]
        if not live:
            return
        slot = self.rng.choice(live)
        p, phase, gen = self.procs[slot]
        deadline = time.monotonic() + 2.0
        want = (PH_PUT, PH_VIEWS, PH_HANDLE) if self.rng.random() < 0.8 else (PH_PUT,)
        while time.monotonic() < deadline and phase.value not in want:
            time.sleep(0.001)
        at = PHASE_NAMES.get(phase.value, str(phase.value))
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=10)
        self.kills[at] = self.kills.get(at, 0) + 1
        self.spawn(slot)

    def check_workers(self) -> None:
        for slot, e in enumerate(self.procs):
            p, _, gen = e
            if not p.is_alive() and not self.stop_evt.is_set():
                p.join(timeout=1)
                self.failures.append(f"worker w{slot} g{gen} exited on its own "
                                     f"(exit code {p.exitcode}); replaced")
                self.spawn(slot)

    def collect(self) -> dict:
        agg = {"ops": {}, "errors": {}, "unexpected": [], "unexpected_count": 0,
               "unexpected_by": {},
               "mismatches": [], "mismatch_count": 0, "verified_bytes": 0, "docs": []}
        for f in sorted(self.stats_dir.glob("*.json")):
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            agg["docs"].append(d)
            for k, v in d.get("ops", {}).items():
                agg["ops"][k] = agg["ops"].get(k, 0) + v
            for k, v in d.get("errors", {}).items():
                agg["errors"][k] = agg["errors"].get(k, 0) + v
            for k, v in d.get("unexpected_by", {}).items():
                agg["unexpected_by"][k] = agg["unexpected_by"].get(k, 0) + v
            tag = f"w{d.get('slot')}g{d.get('gen')}"
            agg["unexpected"] += [f"[{tag}] {u}" for u in d.get("unexpected", [])]
            agg["unexpected_count"] += d.get("unexpected_count", 0)
            agg["mismatches"] += [f"[{tag}] {m}" for m in d.get("mismatches", [])]
            agg["mismatch_count"] += d.get("mismatch_count", 0)
            agg["verified_bytes"] += d.get("verified_bytes", 0)
        return agg

    # -- faults -----------------------------------------------------------------------------------
    def fault_tick(self, now: float) -> None:
        a = self.args
        if self.active_fault and now >= self.active_fault[4]:
            self.clear_fault()
        if a.fault_interval <= 0 or self.active_fault or now < self.next_fault:
            return
        point, action, delay_ms, count = FAULTS[self.fault_i % len(FAULTS)]
        self.fault_i += 1
        argv = ["fault", "set", point, action, "--count", str(count)]
        if action == "delay":
            argv += ["--delay-ms", str(delay_ms)]
        try:
            self.daemon.ctl(*argv)
            hold = min(a.fault_hold, 0.8 * a.fault_interval)
            self.active_fault = (point, action, delay_ms, count, now + hold)
        except Exception as e:  # noqa: BLE001
            self.fault_errors += 1
            self.failures.append(f"fluxonctl {' '.join(argv)} failed: {e}")
        self.next_fault = now + a.fault_interval * self.rng.uniform(0.8, 1.2)

    def clear_fault(self) -> None:
        point, action, delay_ms, count, _ = self.active_fault
        self.active_fault = None
        remaining = 0
        try:
            for r in self.daemon.ctl("fault", "list").get("rules", []):
                if r.get("point") == point and r.get("action") == action:
                    remaining += r.get("count", 0)
            self.daemon.ctl("fault", "clear", point)
        except Exception as e:  # noqa: BLE001
            self.fault_errors += 1
            self.failures.append(f"fluxonctl fault list/clear {point} failed: {e}")
        self.faults_set.append((point, action, delay_ms, count, count - remaining))

    # -- reports ----------------------------------------------------------------------------------
    def progress(self, t: float) -> None:
        agg = self.collect()
        o = agg["ops"]
        try:
            s = self.daemon.stats()
            d = (f"keys {s.get('owner_keys', '?')} evicted {s.get('owner_evicted_pages', '?')} "
                 f"expired-handles {s.get('owner_handles_expired', '?')} "
                 f"publish-retries {s.get('owner_publish_retries', '?')}")
        except Exception as e:  # noqa: BLE001
            d = f"stats failed: {e}"
        errs = ", ".join(f"{k}={v}" for k, v in sorted(agg["errors"].items())) or "none"
        r = read_rss(self.daemon.proc.pid)
        rss, priv = r.get("VmRSS", 0), r.get("VmRSS", 0) - r.get("RssShmem", 0)
        ops = sum(o.get(k, 0) for k in ("put", "rewrite", "get", "get_cross", "delete_session",
                                        "delete_ns"))
        print(f"[{fmt_secs(t):>6}] ops {ops} (put {o.get('put', 0)} rewrite {o.get('rewrite', 0)} "
              f"get {o.get('get', 0)}+{o.get('get_cross', 0)} del "
              f"{o.get('delete_session', 0)}+{o.get('delete_ns', 0)}) | verified "
              f"{fmt_bytes(agg['verified_bytes'])} | errors {errs} | unexpected "
              f"{agg['unexpected_count']} mismatches {agg['mismatch_count']} | kills "
              f"{sum(self.kills.values())} faults {len(self.faults_set) + bool(self.active_fault)}"
              f" | {d} | daemon RSS {fmt_bytes(rss)} (without the segment {fmt_bytes(priv)})",
              flush=True)

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.daemon.start()
        except Exception as e:  # noqa: BLE001
            print(f"soak: {e}", file=sys.stderr)
            return 2
        try:
            return self._run()
        finally:  # whatever happened: no worker and no daemon outlives the soak
            self.stop_evt.set()
            for e in self.procs:
                if e and e[0].is_alive():
                    e[0].kill()
                    e[0].join(timeout=10)
            self.daemon.stop()

    def _run(self) -> int:
        a = self.args
        t_wall0 = time.time()
        self.notes += self.daemon.notes
        baseline = self.daemon.stats()
        missing = [c for c in BASELINE_COUNTERS if c not in baseline]
        for c in missing:
            self.failures.append(f"the daemon reports no counter {c} (fluxonctl stats)")
        print(f"soak: fluxond pid {self.daemon.proc.pid}, socket {self.daemon.sock}, admin "
              f"127.0.0.1:{self.daemon.admin_port}, segment {fmt_bytes(a.segment)}, value_len "
              f"{a.value_len}, {a.workers} workers, {fmt_secs(a.duration)}, dir {self.tmp}",
              flush=True)
        for n in self.notes:
            print(f"soak: note: {n}", flush=True)

        def on_signal(signum, _frame):
            if self.interrupted:
                raise KeyboardInterrupt
            self.interrupted = True
            print(f"soak: signal {signum}: stopping the traffic early (again to abort)",
                  flush=True)
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

        rss_warm = None
        t0 = time.monotonic()
        warmup = a.warmup if a.warmup is not None else min(120.0, max(10.0, 0.2 * a.duration))
        self.next_fault = t0 + min(a.fault_interval, max(5.0, warmup / 2))
        next_kill = t0 + a.kill_interval * self.rng.uniform(0.5, 1.5) if a.kill_interval > 0 \
            else float("inf")
        next_report = t0 + a.report_interval
        try:
            for slot in range(a.workers):
                self.spawn(slot)
            while True:
                now = time.monotonic()
                if now - t0 >= a.duration or self.interrupted:
                    break
                if not self.daemon.alive():
                    self.failures.append(f"fluxond exited during the traffic (exit code "
                                         f"{self.daemon.proc.returncode})")
                    break
                self.check_workers()
                if rss_warm is None and now - t0 >= warmup:
                    rss_warm = read_rss(self.daemon.proc.pid)
                    print(f"soak: warm-up done at {fmt_secs(now - t0)}: daemon RSS "
                          f"{fmt_bytes(rss_warm.get('VmRSS', 0))} (without the segment "
                          f"{fmt_bytes(rss_warm.get('VmRSS', 0) - rss_warm.get('RssShmem', 0))})",
                          flush=True)
                if now >= next_kill:
                    self.kill_one()
                    next_kill = now + a.kill_interval * self.rng.uniform(0.5, 1.5)
                self.fault_tick(now)
                if now >= next_report:
                    self.progress(now - t0)
                    next_report += a.report_interval
                time.sleep(0.05)
            traffic_s = time.monotonic() - t0
            if rss_warm is None:
                rss_warm = read_rss(self.daemon.proc.pid)
                self.notes.append("the run ended before the warm-up: RSS start taken at the end "
                                  "of the traffic")
            # Stop the traffic; workers drain on their own (bounded), stragglers are killed.
            self.stop_evt.set()
            if self.active_fault:
                self.clear_fault()
            try:
                self.daemon.ctl("fault", "clear")
            except Exception as e:  # noqa: BLE001
                if self.daemon.alive():
                    self.failures.append(f"fluxonctl fault clear failed: {e}")
            stop_deadline = time.monotonic() + 40.0
            for slot, (p, _, gen) in enumerate(self.procs):
                p.join(timeout=max(0.1, stop_deadline - time.monotonic()))
                if p.is_alive():
                    self.failures.append(f"worker w{slot} g{gen} did not stop within 40 s "
                                         "after the traffic: killed")
                    p.kill()
                    p.join(timeout=10)
                elif p.exitcode != 0:
                    self.failures.append(f"worker w{slot} g{gen} exited with {p.exitcode}")
            if not self.daemon.alive() and not any("fluxond exited" in f for f in self.failures):
                self.failures.append(f"fluxond exited (exit code {self.daemon.proc.returncode})")
            if self.daemon.alive():
                self.progress(traffic_s)
            # Temporary counters back at baseline?
            settle = self.settle(baseline)
            rss_end = read_rss(self.daemon.proc.pid) if self.daemon.alive() else {}
            try:
                final_stats = self.daemon.stats() if self.daemon.alive() else {}
            except Exception:  # noqa: BLE001
                final_stats = {}
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.stop_evt.set()
            for e in self.procs:
                if e and e[0].is_alive():
                    e[0].kill()
                    e[0].join(timeout=10)
        if self.interrupted:
            self.failures.append(f"interrupted after {fmt_secs(traffic_s)} of "
                                 f"{fmt_secs(self.args.duration)} (the checks ran on the shorter "
                                 "run)")
        rc_daemon, how = self.daemon.stop()
        if how.startswith("SIGKILL") or (rc_daemon not in (0, -signal.SIGTERM)
                                         and how == "SIGTERM"):
            self.failures.append(f"fluxond stop: exit code {rc_daemon} ({how})")
        log = self.daemon.log.read_text(errors="replace")
        log_levels = {lv: len(re.findall(rf"\[{lv}\]", log)) for lv in ("warning", "error",
                                                                          "critical")}
        if log_levels["critical"]:
            self.failures.append(f"fluxond logged {log_levels['critical']} critical lines")
        return self.summarize(t_wall0, traffic_s, settle, rss_warm, rss_end, final_stats,
                              baseline, rc_daemon, how, log_levels, log)

    def settle(self, baseline: dict) -> dict:
        """Waits (bounded) for the temporary counters to return to their baseline values."""
        a = self.args
        t0 = time.monotonic()
        last, ok, routes_ok, routes = {}, False, False, None
        if not self.daemon.alive():
            return {"ok": False, "secs": 0.0, "last": {}, "routes": None, "skipped": True}
        while self.daemon.alive():
            try:
                s = self.daemon.stats()
                last = {c: s.get(c) for c in BASELINE_COUNTERS}
                ok = all(last[c] == baseline.get(c) for c in BASELINE_COUNTERS)
                # Settled, the master's route table holds exactly the owner's committed values.
                routes = tuple(s.get(c) for c in ROUTE_COUNTERS)
                routes_ok = None in routes or len(set(routes)) == 1
            except Exception as e:  # noqa: BLE001
                last = {"error": str(e)}
            if (ok and routes_ok) or time.monotonic() - t0 > a.settle_timeout:
                break
            time.sleep(0.25)
        secs = time.monotonic() - t0
        if not ok:
            off = {c: (baseline.get(c), last.get(c)) for c in BASELINE_COUNTERS
                   if last.get(c) != baseline.get(c)}
            self.failures.append(f"counters not back at baseline {a.settle_timeout:.0f} s after "
                                 f"the traffic (counter: baseline -> now): {off}")
        if routes is not None and None in routes:
            self.notes.append(f"route check skipped: the daemon does not report all of "
                              f"{ROUTE_COUNTERS}")
        elif routes is not None and not routes_ok:
            self.failures.append(f"route table not consistent {a.settle_timeout:.0f} s after the "
                                 f"traffic: " + ", ".join(
                                     f"{c}={v}" for c, v in zip(ROUTE_COUNTERS, routes)))
        return {"ok": ok and routes_ok, "secs": secs, "last": last, "routes": routes}

    def summarize(self, t_wall0, traffic_s, settle, rss_warm, rss_end, final_stats, baseline,
                  rc_daemon, how, log_levels, log) -> int:
        a = self.args
        agg = self.collect()
        o, errs = agg["ops"], agg["errors"]
        if agg["mismatch_count"]:
            self.failures.append(f"{agg['mismatch_count']} pages failed byte-exact verification")
        if agg["unexpected_count"]:
            self.failures.append(f"{agg['unexpected_count']} unexpected exceptions / contract "
                                 "violations in workers")
        done_docs = [d for d in agg["docs"] if d.get("done")]
        finals = {(d["slot"], d["gen"]) for d in done_docs}
        for slot, (p, _, gen) in enumerate(self.procs):
            if (slot, gen) not in finals:
                self.failures.append(f"worker w{slot} g{gen} wrote no final report")
        # VmRSS includes the segment pages the daemon touched (RssShmem, up to the segment
        # size); the private part (VmRSS - RssShmem: heap, stacks, code) is checked on its own
        # too, or a leak would hide in the segment's share.
        rss0, rss1 = rss_warm.get("VmRSS", 0), rss_end.get("VmRSS", 0)
        priv0 = rss0 - rss_warm.get("RssShmem", 0)
        priv1 = rss1 - rss_end.get("RssShmem", 0)
        limit = rss0 * (1 + a.rss_tolerance) + a.rss_slack
        plimit = priv0 * (1 + a.rss_tolerance) + a.rss_slack
        rss_ok = bool(rss1) and rss1 <= limit and priv1 <= plimit
        if not rss1:
            pass  # the daemon is gone: already a failure
        elif rss1 > limit:
            self.failures.append(f"daemon RSS {fmt_bytes(rss1)} at the end > limit "
                                 f"{fmt_bytes(limit)} (warm-up {fmt_bytes(rss0)} + "
                                 f"{a.rss_tolerance:.0%} + {fmt_bytes(a.rss_slack)})")
        elif priv1 > plimit:
            self.failures.append(f"daemon private RSS (VmRSS - RssShmem) {fmt_bytes(priv1)} at "
                                 f"the end > limit {fmt_bytes(plimit)} (warm-up "
                                 f"{fmt_bytes(priv0)} + {a.rss_tolerance:.0%} + "
                                 f"{fmt_bytes(a.rss_slack)})")

        print()
        if agg["mismatches"]:
            print("byte mismatches (first ones):")
            for m in agg["mismatches"][:20]:
                print(f"  {m}")
        if agg["unexpected"]:
            print("unexpected exceptions / violations by kind: " + ", ".join(
                f"{k} {v}" for k, v in sorted(agg["unexpected_by"].items())))
            seen = set()
            for u in agg["unexpected"]:
                kind = u.split("] ", 1)[-1].split(": ", 1)[0]
                if kind not in seen and len(seen) < 10:
                    seen.add(kind)
                    print(f"  first {u}")
        errlines = [ln for ln in log.splitlines() if "[error]" in ln or "[critical]" in ln]
        if errlines:
            print(f"fluxond error lines ({len(errlines)}, first 5):")
            for ln in errlines[:5]:
                print(f"  {ln}")

        fired = sum(f[4] for f in self.faults_set)
        fault_desc = "; ".join(
            f"{p} {act}{f' {d}ms' if act == 'delay' else ''} x{c} (fired {fi})"
            for p, act, d, c, fi in self.faults_set) or "none"
        kill_desc = ", ".join(f"{k} {v}" for k, v in sorted(self.kills.items())) or "none"
        err_desc = ", ".join(f"{k} {v}" for k, v in sorted(errs.items())) or "none"
        fs = final_stats

        def g(k):
            return fs.get(k, "?")

        rows = [
            ("date", datetime.datetime.fromtimestamp(t_wall0).strftime("%Y-%m-%d %H:%M")),
            ("machine", f"{os.cpu_count()} cores, {platform.machine()}, "
                        f"{platform.platform(terse=True)}"),
            ("command", "python3 bench/soak.py " + " ".join(sys.argv[1:])),
            ("traffic", f"{fmt_secs(traffic_s)}{' (interrupted)' if self.interrupted else ''}, "
                        f"{a.workers} workers, value_len {a.value_len} B, segment "
                        f"{fmt_bytes(a.segment)}, handle_ttl {a.handle_ttl_ms} ms"),
            ("put batches", f"{o.get('put', 0)} (+{o.get('rewrite', 0)} rewrites): "
                            f"{o.get('commit', 0)} committed ({o.get('put_grouped', 0)} with "
                            f"atomic groups), {o.get('put_abort', 0)} aborted, "
                            f"{o.get('pages_put', 0)} pages; futures ok {o.get('future_ok', 0)}"),
            ("get batches", f"{o.get('get', 0)} own + {o.get('get_cross', 0)} cross-worker: "
                            f"{o.get('release', 0)} transferred "
                            f"({o.get('consume_prefix', 0)} shorter consume_prefix_len), "
                            f"{o.get('cancel', 0)} cancelled, {o.get('abandon', 0)} abandoned "
                            f"({o.get('abandon_expired', 0)} checked expired); hit pages "
                            f"{o.get('get_pages_hit', 0)} of {o.get('get_pages_requested', 0)}"),
            ("verified", f"{o.get('pages_verified', 0)} pages, "
                         f"{fmt_bytes(agg['verified_bytes'])} byte-exact, "
                         f"{agg['mismatch_count']} mismatches"),
            ("deletes", f"{o.get('delete_session', 0)} session + {o.get('delete_ns', 0)} "
                        f"namespace: {o.get('pages_deleted', 0)} pages deleted, "
                        f"{o.get('pages_kept_in_use', 0)} kept in use"),
            ("expected errors", err_desc),
            ("unexpected", str(agg["unexpected_count"]) + "".join(
                f", {k} {v}" for k, v in sorted(agg["unexpected_by"].items()))),
            ("worker kills (SIGKILL)", f"{sum(self.kills.values())} ({kill_desc})"),
            ("faults injected", f"{len(self.faults_set)}, {fired} fired: {fault_desc}"),
            ("daemon counters", f"evicted {g('owner_evicted_pages')} pages in "
                                f"{g('owner_eviction_rounds')} rounds, handles expired "
                                f"{g('owner_handles_expired')}, publish retries "
                                f"{g('owner_publish_retries')}, route-remove retries "
                                f"{g('owner_route_remove_retries')}, disconnects "
                                f"{g('owner_disconnects')}, keys {g('owner_keys')}, master "
                                f"routes {g('master_routes')}"),
            ("baseline check", "not run (fluxond is gone)") if settle.get("skipped") else
            ("baseline check", ("pass" if settle["ok"] else "FAIL") +
                               f" after {settle['secs']:.1f} s ({len(BASELINE_COUNTERS)} "
                               f"counters: " + ", ".join(
                                   f"{c.removeprefix('owner_')}={settle['last'].get(c)}"
                                   for c in BASELINE_COUNTERS) + "; routes " + (
                                   "n/a" if settle["routes"] is None else "=".join(
                                       f"{c.split('_', 1)[1]} {v}" for c, v in
                                       zip(ROUTE_COUNTERS, settle["routes"]))) + ")"),
            ("daemon RSS", f"{fmt_bytes(rss0)} after warm-up -> {fmt_bytes(rss1)} at the end "
                           f"(limit {fmt_bytes(limit)}: +{a.rss_tolerance:.0%} + "
                           f"{fmt_bytes(a.rss_slack)}); without the segment (VmRSS - "
                           f"RssShmem) {fmt_bytes(priv0)} -> {fmt_bytes(priv1)} (limit "
                           f"{fmt_bytes(plimit)}); {'pass' if rss_ok else 'FAIL'}"),
            ("daemon stop", f"exit code {rc_daemon} ({how}); log: {log_levels['warning']} "
                            f"warnings, {log_levels['error']} errors, "
                            f"{log_levels['critical']} critical"),
            ("result", "PASS" if not self.failures else f"FAIL ({len(self.failures)})"),
        ]
        print("| soak | |")
        print("|---|---|")
        for k, v in rows:
            print(f"| {k} | {v.replace('|', '/')} |")
        for n in self.notes:
            print(f"note: {n}")
        if self.failures:
            print("\nFAILED:")
            for f in self.failures:
                print(f"  - {f}")
        else:
            print("\nsoak passed")
        if self.failures or a.keep_dir:
            print(f"(daemon log and worker reports kept in {self.tmp})")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return 1 if self.failures else 0


def main() -> int:
    if "--cluster" in sys.argv[1:]:
        # Cluster mode: a master and two owners under traffic and the cluster's faults
        # (bench/soak_cluster.py); the same --fluxond, --duration and --seed.
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import soak_cluster
        sys.argv.remove("--cluster")
        ap = argparse.ArgumentParser(description=soak_cluster.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--fluxond", default=str(ROOT / "build" / "src" / "fluxond"))
        ap.add_argument("--duration", type=soak_cluster.parse_duration,
                        default=soak_cluster.parse_duration("3m"))
        ap.add_argument("--seed", type=int, default=1)
        soak_cluster.add_arguments(ap)
        return soak_cluster.run(ap.parse_args())
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fluxond", default=str(ROOT / "build" / "src" / "fluxond"))
    ap.add_argument("--fluxonctl", default=None,
                    help="default: fluxonctl next to --fluxond")
    ap.add_argument("--duration", type=parse_duration, default=parse_duration("30m"),
                    help="traffic time (30m, 90s, 1h; default 30m)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--value-len", type=parse_size, default=256 * 1024,
                    help="bytes per page (multiple of 8; default 256KiB)")
    ap.add_argument("--segment", type=parse_size, default=2 << 30,
                    help="owner segment size (default 2GiB: small enough that eviction runs)")
    ap.add_argument("--session-pages", type=int, default=512,
                    help="pages per session chain before the worker starts a new chain")
    ap.add_argument("--handle-ttl-ms", type=int, default=2000)
    ap.add_argument("--claim-timeout-ms", type=int, default=2000,
                    help="owner claim_hard_timeout_ms: how long a put waits for room")
    ap.add_argument("--copy-threads", type=int, default=1)
    ap.add_argument("--report-interval", type=parse_duration, default=60.0)
    ap.add_argument("--kill-interval", type=parse_duration, default=45.0,
                    help="mean time between worker SIGKILLs (0: none; default 45s)")
    ap.add_argument("--fault-interval", type=parse_duration, default=60.0,
                    help="mean time between injected faults (0: none; default 60s)")
    ap.add_argument("--fault-hold", type=parse_duration, default=20.0,
                    help="a fault rule is cleared this long after it was set (default 20s)")
    ap.add_argument("--warmup", type=parse_duration, default=None,
                    help="RSS reference point (default 20%% of --duration, within 10s..120s)")
    ap.add_argument("--settle-timeout", type=parse_duration, default=30.0)
    ap.add_argument("--rss-tolerance", type=float, default=0.10,
                    help="allowed RSS growth after warm-up as a fraction (default 0.10)")
    ap.add_argument("--rss-slack", type=parse_size, default=16 << 20,
                    help="allowed RSS growth on top of --rss-tolerance (default 16MiB)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep-dir", action="store_true", help="keep the temp dir (log, reports)")
    ap.add_argument("--write-config", metavar="PATH", default=None,
                    help="write the daemon config the soak would use to PATH and exit")
    args = ap.parse_args()
    if args.fluxonctl is None:
        args.fluxonctl = str(Path(args.fluxond).parent / "fluxonctl")
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    if args.value_len <= 0 or args.value_len % 8 or args.value_len > 64 << 20:
        ap.error("--value-len must be a positive multiple of 8, at most 64MiB")
    if args.workers < 1:
        ap.error("--workers must be >= 1")
    if args.duration <= 0:
        ap.error("--duration must be positive")
    if args.write_config:
        Path(args.write_config).write_text(make_config(
            "/tmp/fluxon-soak/owner.sock", free_port(), args.segment, args.handle_ttl_ms,
            args.claim_timeout_ms))
        print(f"wrote {args.write_config}")
        return 0
    for exe in (args.fluxond, args.fluxonctl):
        if not os.access(exe, os.X_OK):
            print(f"soak: {exe} is not an executable (build first, or pass --fluxond)",
                  file=sys.stderr)
            return 2
    try:
        import fluxon  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "build" / "python"))  # spawned workers inherit sys.path
        try:
            import fluxon  # noqa: F401,F811
        except ImportError as e:
            print(f"soak: cannot import fluxon ({e}); set PYTHONPATH=build/python",
                  file=sys.stderr)
            return 2
    print(f"soak: seed {args.seed}", flush=True)
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
