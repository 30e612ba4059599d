#!/usr/bin/env python3
"""Replicas by pull, measured with real processes on loopback (docs/replicas.md).

A master restricted to remote_cache targets, a source owner (node 1) and a remote_cache (node 3),
each its own fluxond and config (TCP data plane, the daemon's defaults). Two measurements, their
modes alternating inside every round (the VM is noisy); the summary gives medians over rounds.

1. Replica throughput. The source puts a batch with make_replica_task=True (128 x 4,718,592 B
   and 1,024 x 65,536 B); the clock runs from the commit's acknowledgement (the routes are
   published, the tasks queued) until the source counts every task completed (its stats, polled
   every 0.5 ms): pages/s and GB/s of pulls, and the shares of that time the remote_cache spent
   in its data-plane reads and in its control steps (claims, BatchGetStart, BatchGetDone,
   installs: each printed apart too), and
   the source in its PlaceReplicas and PullReplicas calls (summed over the batches in flight, so
   a share can pass 100 %). The ceiling in the same round is the data
   plane's own read of the same values between two processes: `bench_transport` (fluxon-tcp and
   raw-tcp at the daemon's 4 connections per peer, --values/--value-len as above).
   One batch's replicas are one wave: its pulls (replica_batch_keys each, replica_pulls_in_flight
   at once) start together, so their control steps all come before their reads and none overlaps
   another's read; that is the time to replicate one put batch. The steady rate is measured
   apart ("backlog"): with the remote_cache stopped (SIGSTOP) the source puts several batches
   (--backlog-bytes), its first pulls waiting on the stopped target and the rest queued; the clock
   runs from SIGCONT until every task settled, so the pulls follow one another as a stream (one
   pull's control steps beside another's read) and the put rate does not bound them.
2. The put cycle with replicas on and off: batches of 64 x 262,144 B (start, copy, commit, wait
   for PutDone), p50 and p99 per mode; replicas on puts with make_replica_task=True, so the pulls
   of earlier batches run while later batches are put; "on-paused" puts the same way with the
   remote_cache stopped (SIGSTOP): the replica machinery on the put's side runs (tasks queued,
   placed, pulls asked for and waiting) but no pull moves data, which separates the put path's
   own cost of replication from the CPU the pulls take on the same cores.

Both owners populate their whole segments before the first round (the source 4 GiB, the
remote_cache 8 GiB), as owners that have been running have; each round uses new keys, and the
source evicts its oldest values by its own policy when full. Exit status 1 if a replica task did not complete.

    PYTHONPATH=build/python python3 bench/replica_bench.py [--rounds 5] [--json FILE]
"""

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import fluxon

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_cluster import Proc, free_port  # noqa: E402  (one process wrapper for the benches)

SHAPES = [(128, 4_718_592), (1024, 65_536)]
# The remote_cache's control steps of a pull, in order (fluxon_remote_get_seconds_total{part}):
# claiming target slots, BatchGetStart, BatchGetDone (or Revoke), installing the copies.
CONTROL_PARTS = ("claim", "start", "finish", "install")
CYCLE_PAGES, CYCLE_LEN = 64, 262_144


def start_cluster(fluxond, tmp, cache_gib=8, batch_keys=256, pulls_in_flight=8):
    mport, madmin = free_port(), free_port()
    master = Proc(fluxond, f"""
role: master
log_level: warn
master:
  listen_address: "127.0.0.1:{mport}"
  replica_task_placement: {{remote_only_node_roles: [remote_cache],
                           restrict_to_remote_only_node_roles: true}}
admin: {{listen_address: "127.0.0.1:{madmin}", metrics_port: 0}}
""", tmp, "master")
    sock = f"{tmp}/owner.sock"
    cache_admin, owner_admin = free_port(), free_port()
    owner = Proc(fluxond, f"""
role: owner
node_id: 1
log_level: warn
admin: {{listen_address: "127.0.0.1:{owner_admin}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{mport}"
  socket_path: {sock}
  segment: {{size: 4GiB}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  replica_batch_keys: {batch_keys}
  replica_pulls_in_flight: {pulls_in_flight}
  local_reserve: {{warm_grants: 8}}
""", tmp, "owner")
    cache = Proc(fluxond, f"""
role: remote_cache
node_id: 3
log_level: warn
admin: {{listen_address: "127.0.0.1:{cache_admin}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{mport}"
  segment: {{size: {cache_gib}GiB}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  local_reserve: {{warm_grants: {2 * cache_gib}}}
""", tmp, "remote-cache")
    # Both owners populate their segments up front (every grant position warm): the puts and
    # pulls measured write into populated memory, as in owners that have been running (a
    # grant's first touch is the put path's own cost: docs/perf.md, "first put of a size").
    deadline = time.time() + 300
    for admin, grants in ((cache_admin, 2 * cache_gib), (owner_admin, 8)):
        while stats_of(fluxonctl_of(fluxond), admin).get("owner_grants_warm", 0) < grants:
            if time.time() > deadline:
                raise RuntimeError("an owner did not populate its segment in time")
            time.sleep(0.2)
    return [cache, owner, master], sock, lambda: stats_of(fluxonctl_of(fluxond), cache_admin)


def fluxonctl_of(fluxond):
    return str(Path(fluxond).parent / "fluxonctl")


def stats_of(fluxonctl, admin_port):
    r = subprocess.run([fluxonctl, "--admin", f"127.0.0.1:{admin_port}", "--json", "stats"],
                       capture_output=True, text=True, timeout=20)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}


def put(client, keys, value_len, buf, replicate):
    opts = fluxon.PutOptionalArgs(make_replica_task=replicate)
    plan = client.local_fast_put_start(keys, value_len, opts)
    fluxon.copy_to_plan(plan, buf.ctypes.data, value_len)
    client.local_fast_put_commit(plan).wait(60)


# Every enqueued replica task ends in exactly one of these (the source's replica_tasks_* stats).
TASK_ENDS = ("completed", "already_held", "obsolete", "source_gone", "no_space", "failed")


def settled(s):
    return sum(s.get(f"replica_tasks_{o}", 0) for o in TASK_ENDS)


def await_replicas(client, before, count, tag, t0, poll_s):
    """Waits (at most 120 s from t0, polling the source's stats every poll_s) until `count` more
    replica tasks than in `before` have settled; all of them must have completed. Returns the
    seconds since t0 and the last stats."""
    deadline = t0 + 120
    while True:
        s = client.stats()
        if settled(s) - settled(before) >= count:
            break
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the replicas of {tag} did not settle: {s}")
        time.sleep(poll_s)
    elapsed = time.perf_counter() - t0
    ended = {o: s.get(f"replica_tasks_{o}", 0) - before.get(f"replica_tasks_{o}", 0)
             for o in TASK_ENDS}
    if ended["completed"] != count:
        raise RuntimeError(f"{tag}: {ended['completed']} of {count} replicas completed "
                           f"(tasks ended: {ended})")
    return elapsed, s


def replicate_once(client, cache_stats, tag, pages, value_len, buf):
    """Seconds from the commit's acknowledgement until every task of the batch completed, and
    where the time went, in seconds summed over the batches in flight: the remote_cache's
    data-plane reads ("read") and its control steps (claims, BatchGetStart/Done: "control"),
    the source's PlaceReplicas calls ("place") and its PullReplicas calls ("pull", which
    contain the remote_cache's read and control)."""
    cache_before = cache_stats()
    before = client.stats()
    keys = [f"{tag}-{i}" for i in range(pages)]
    put(client, keys, value_len, buf, True)
    elapsed, s = await_replicas(client, before, pages, tag, time.perf_counter(), poll_s=0.0005)
    cache_after = cache_stats()
    parts = {part: (cache_after.get(f"owner_remote_{part}_us", 0) -
                    cache_before.get(f"owner_remote_{part}_us", 0)) / 1e6
             for part in ("read",) + CONTROL_PARTS}
    parts["control"] = sum(parts[p] for p in CONTROL_PARTS)
    for part in ("place", "pull"):
        parts[part] = (s.get(f"replica_{part}_us", 0) - before.get(f"replica_{part}_us", 0)) / 1e6
    return elapsed, parts


def backlog_batches(backlog_bytes, pages, value_len):
    """Whole batches of at least backlog_bytes, their keys within the source's replica queue
    (owner.replica_queue_keys, default 16,384: a group that does not fit is dropped)."""
    return max(1, min(-(-backlog_bytes // (pages * value_len)), 16_384 // pages))


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replicate_backlog(client, procs, tag, pages, value_len, buf, batches):
    """Seconds to drain `batches` put batches' replicas queued behind a stopped remote_cache,
    from SIGCONT until every task settled, and the CPU seconds each daemon spent meanwhile
    (remote_cache, source, master)."""
    cache_proc = procs[0]
    before = client.stats()
    cache_proc.p.send_signal(signal.SIGSTOP)
    try:
        t_put = time.perf_counter()
        for b in range(batches):
            put(client, [f"{tag}-{b}-{i}" for i in range(pages)], value_len, buf, True)
        put_s = time.perf_counter() - t_put
        if put_s > 3:
            # The master would soon stop placing on a target it has not heard from.
            print(f"warning: the backlog's puts took {put_s:.1f} s", file=sys.stderr)
    finally:
        cpu0 = [cpu_seconds(p.p.pid) for p in procs]
        t0 = time.perf_counter()
        cache_proc.p.send_signal(signal.SIGCONT)
    # The drain lasts 50 ms or more: 1 ms resolution, half the polls of one batch's wait.
    elapsed, _ = await_replicas(client, before, pages * batches, tag, t0, poll_s=0.001)
    cpu = [cpu_seconds(p.p.pid) - c for p, c in zip(procs, cpu0)]
    return elapsed, cpu


def transport_ceiling(bench, peer, pages, value_len):
    """GB/s of fluxon-tcp and raw-tcp at 4 connections for the same values (bench_transport)."""
    cmd = shlex.split(bench) + ["--rounds=1", "--batches=3", "--connections=4",
                                f"--values={pages}", f"--value-len={value_len}"]
    if peer:
        cmd.append(f"--peer={peer}")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"bench_transport failed: {r.stderr[-2000:]}")
    out = {}
    for mode in ("fluxon-tcp", "raw-tcp"):
        m = re.search(rf"^\| {mode} \| 4 \| ([0-9.]+) \|", r.stdout, re.M)
        out[mode] = float(m.group(1))
    return out


def put_cycles(client, tag, batches, buf, replicate):
    out = []
    for b in range(batches):
        keys = [f"{tag}-{b}-{i}" for i in range(CYCLE_PAGES)]
        t0 = time.perf_counter()
        put(client, keys, CYCLE_LEN, buf, replicate)
        out.append(time.perf_counter() - t0)
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fluxond", default="build/src/fluxond")
    ap.add_argument("--bench-transport", default="build/bench/bench_transport",
                    help="the ceiling's command (split like a shell line: an env prefix is fine)")
    ap.add_argument("--transport-peer", default=None,
                    help="bench_transport's serving process (default: its build's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cycle-batches", type=int, default=40)
    ap.add_argument("--batch-keys", type=int, default=256,
                    help="the source's owner.replica_batch_keys")
    ap.add_argument("--pulls-in-flight", type=int, default=8,
                    help="the source's owner.replica_pulls_in_flight")
    ap.add_argument("--backlog-bytes", type=int, default=768 << 20,
                    help="bytes put behind a stopped remote_cache per shape and round for the "
                         "steady rate (whole batches, at least one; 0: not measured)")
    ap.add_argument("--shapes", default=",".join(f"{p}x{v}" for p, v in SHAPES),
                    help="comma-separated COUNTxBYTES put batches to replicate (default: both)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="fxrepl"))
    procs, sock, cache_stats = start_cluster(a.fluxond, tmp, batch_keys=a.batch_keys,
                                             pulls_in_flight=a.pulls_in_flight)
    rows = {f"{p}x{v}": {"replica_s": [], "backlog_gbps": [], "cpu_cache": [], "cpu_source": [],
                         "cpu_master": [], "read": [], "control": [],
                         "place": [], "pull": [],
                         "fluxon-tcp": [], "raw-tcp": [], **{c: [] for c in CONTROL_PARTS}}
            for p, v in shapes}
    cycles = {"off": [], "on": [], "on-paused": []}
    cache_proc = procs[0]
    try:
        client = fluxon.KvClient(socket_path=sock)
        bufs = {v: np.random.default_rng(v).integers(0, 255, p * v, dtype=np.uint8)
                for p, v in shapes}
        cycle_buf = np.random.default_rng(1).integers(0, 255, CYCLE_PAGES * CYCLE_LEN,
                                                      dtype=np.uint8)
        for r in range(a.rounds):
            for p, v in shapes:
                name = f"{p}x{v}"
                sec, parts = replicate_once(client, cache_stats, f"r{r}-{name}", p, v, bufs[v])
                rows[name]["replica_s"].append(sec)
                for part, part_s in parts.items():
                    rows[name][part].append(part_s)
                if a.backlog_bytes > 0:
                    batches = backlog_batches(a.backlog_bytes, p, v)
                    sec, cpu = replicate_backlog(client, procs, f"r{r}-{name}-backlog", p, v,
                                                 bufs[v], batches)
                    gb = batches * p * v / 1e9
                    rows[name]["backlog_gbps"].append(gb / sec)
                    for who, c in zip(("cache", "source", "master"), cpu):
                        rows[name][f"cpu_{who}"].append(1e3 * c / gb)
                for mode, gbps in transport_ceiling(a.bench_transport, a.transport_peer, p, v).items():
                    rows[name][mode].append(gbps)
            modes = ["off", "on", "on-paused"]
            for mode in modes[r % 3:] + modes[:r % 3]:
                if mode == "on-paused":
                    cache_proc.p.send_signal(signal.SIGSTOP)  # no pull moves data meanwhile
                try:
                    cycles[mode] += put_cycles(client, f"c{r}-{mode}", a.cycle_batches,
                                               cycle_buf, mode != "off")
                finally:
                    if mode == "on-paused":
                        cache_proc.p.send_signal(signal.SIGCONT)
            # The replicas of the last "on" batches settle before the next round.
            deadline = time.time() + 60
            while client.stats().get("replica_queue_keys", 0) != 0 and time.time() < deadline:
                time.sleep(0.01)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
        s = client.stats()
    finally:
        for p in procs:
            p.stop()
    print(f"replica throughput, median of {a.rounds} rounds (pull path vs the data plane's read "
          "of the same values in the same round, 4 connections)")
    print("| values | replica pages/s | replica GB/s | of it reads | control | place | pull calls "
          "| fluxon-tcp GB/s | raw-tcp GB/s | vs fluxon-tcp | vs raw-tcp |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for p, v in shapes:
        name = f"{p}x{v}"
        sec = statistics.median(rows[name]["replica_s"])
        gbps = p * v / sec / 1e9
        ft = statistics.median(rows[name]["fluxon-tcp"])
        raw = statistics.median(rows[name]["raw-tcp"])
        summary[name] = {"replica_s": sec, "replica_gbps": gbps, "fluxon_tcp_gbps": ft,
                         "raw_tcp_gbps": raw, "rounds": rows[name]}
        share = {part: 100 * statistics.median(rows[name][part]) / sec
                 for part in ("read", "control", "place", "pull")}
        print(f"| {p} x {v:,} B | {p / sec:,.0f} | {gbps:.2f} | {share['read']:.0f} % | "
              f"{share['control']:.0f} % | {share['place']:.0f} % | {share['pull']:.0f} % | "
              f"{ft:.2f} | {raw:.2f} | {100 * gbps / ft:.0f} % | {100 * gbps / raw:.0f} % |")
    if a.backlog_bytes > 0:
        print()
        print("steady rate: the replicas of several put batches drained as a stream (queued "
              "behind a stopped remote_cache, timed from its SIGCONT), medians")
        print("| values | batches | replica GB/s (rounds) | fluxon-tcp GB/s | vs fluxon-tcp | "
              "vs raw-tcp | CPU ms per GB: remote_cache / source / master |")
        print("|---|---|---|---|---|---|---|")
        for p, v in shapes:
            name = f"{p}x{v}"
            xs = rows[name]["backlog_gbps"]
            g = statistics.median(xs)
            ft = summary[name]["fluxon_tcp_gbps"]
            raw = summary[name]["raw_tcp_gbps"]
            summary[name]["backlog_gbps"] = g
            print(f"| {p} x {v:,} B | {backlog_batches(a.backlog_bytes, p, v)} | {g:.2f} ("
                  + ", ".join(f"{x:.2f}" for x in xs) + f") | {ft:.2f} | {100 * g / ft:.0f} % | "
                  f"{100 * g / raw:.0f} % | " + " / ".join(
                      f"{statistics.median(rows[name][f'cpu_{w}']):.0f}"
                      for w in ("cache", "source", "master")) + " |")
    print()
    print("the remote_cache's control steps, shares of the elapsed time (medians; summed over the "
          "batches in flight)")
    print("| values | " + " | ".join(CONTROL_PARTS) + " |")
    print("|---|" + "---|" * len(CONTROL_PARTS))
    for p, v in shapes:
        name = f"{p}x{v}"
        sec = statistics.median(rows[name]["replica_s"])
        print(f"| {p} x {v:,} B | " + " | ".join(
            f"{100 * statistics.median(rows[name][c]) / sec:.0f} %" for c in CONTROL_PARTS) + " |")
    print()
    print(f"put cycle, {CYCLE_PAGES} x {CYCLE_LEN:,} B per batch, {a.cycle_batches} batches per "
          f"mode per round, {a.rounds} rounds")
    print("| replicas | p50 ms | p99 ms | batches |")
    print("|---|---|---|---|")
    for mode in ("off", "on", "on-paused"):
        xs = cycles[mode]
        summary[f"cycle_{mode}"] = {"p50_ms": 1e3 * pct(xs, 0.5), "p99_ms": 1e3 * pct(xs, 0.99)}
        print(f"| {mode} | {1e3 * pct(xs, 0.5):.1f} | {1e3 * pct(xs, 0.99):.1f} | {len(xs)} |")
    outcomes = ("enqueued", "queue_full", "duplicate", "completed", "already_held", "obsolete",
                "source_gone", "no_space", "failed")
    counters = {o: s.get(f"replica_tasks_{o}", 0) for o in outcomes}
    counters["pull_calls"] = s.get("replica_pull_calls", 0)
    summary["source_counters"] = counters
    print("source counters: " + ", ".join(f"{k} {v}" for k, v in counters.items()))
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    return 0 if s.get("replica_tasks_failed", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
