#!/usr/bin/env python3
"""Capacity split: an owner with L bytes plus a remote_cache with R bytes, against the owner alone
at L, a single owner at L + R, and Mooncake Store with two segments of L and R (equal total
bytes), on SGLang's multi-turn HiCache pattern (bench/mooncake_compare.py's workload: every turn
a session's prompt is its whole context plus new pages; restore the longest stored prefix, back
up the rest).

Configurations, each started fresh, in an order that alternates per round (the VM is noisy):
- owner-L: an embedded fluxond with an L-byte segment;
- owner-L+rc-R: a master, an owner of L bytes with owner.demotion on (cold values move to the
  remote_cache before pressure deletes them) and a remote_cache of R bytes, each its own
  fluxond on loopback; the client talks to the owner, a demoted page comes back by remote get;
- owner-L+rc-R-ranked: the same with one ranking for both tiers (owner.demotion.
  remote_budget_bytes = --remote-budget of R): the owner's policy keeps ranking what it demoted
  and asks the remote_cache to drop what it evicts; a value fetched back keeps its copy there
  and is released here first (owner.demotion.keep_fetched_copies, the default);
- owner-L+rc-R-ranked-drop: one ranking with keep_fetched_copies: false (a value fetched back
  gives up its copy there and is demoted again when it cools);
- owner-L+R: an embedded fluxond with an (L + R)-byte segment (the single-machine ceiling);
- mooncake-L+R: a mooncake_master and two store clients contributing L and R bytes of global
  segment (the client drives the first; puts land in either segment).

Reported per configuration (medians over rounds): hit rate, pages/s, and the put batch p50/p99 as
the client sees it (start + copy + commit call). Goals: owner-L+rc-R at >= 95 % of
owner-L+R's hit rate and above Mooncake's at equal total bytes; its put p99 not worse than
owner-L's.

    pip install mooncake-transfer-engine-non-cuda tqdm
    PYTHONPATH=build/python python3 bench/capacity_split.py [--local 1GiB --remote 1GiB] \\
        [--rounds 3] [--sessions 16 --turns 4] [--turn-ms 200] [--json FILE]

The eviction traces instead of the multi-turn sessions (sizes as shares of the trace's working
set, rounded to 512 MiB grants; pick --value-len so that a share is a whole grant):

    build/bench/bench_eviction_policy --dump-traces /tmp/evtraces
    PYTHONPATH=build/python:bench python3 bench/capacity_split.py --trace /tmp/evtraces/zipf1.1.trace \\
        --value-len 122880 --local 25% --remote 25% --rounds 3
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import fluxon

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mooncake_compare as mc  # noqa: E402  (the workload and both systems' sides)
from soak_cluster import free_port  # noqa: E402

UNITS = {"GiB": 1 << 30, "MiB": 1 << 20}


def parse_bytes(s, working_set):
    """"1GiB", "512MiB", or "25%" of the working set's bytes (rounded to whole 512 MiB grants,
    the segment's unit)."""
    if s.endswith("%"):
        grant = 512 << 20
        return max(grant, round(float(s[:-1]) / 100 * working_set / grant) * grant)
    return int(float(s[:-3]) * UNITS[s[-3:]])


def replay_trace(side, prompts, args, pool, out):
    """The eviction traces' prompts (bench/eviction_tables.sh), served as multiturn serves a turn."""
    requested = hit = written = failed = 0
    turn_s = args.turn_ms / 1e3  # paced like the multi-turn sessions: the GPU's time per prompt
    t0 = time.perf_counter()
    for prompt in prompts:
        keys = [f"{side.name}:{p}" for p in prompt]
        requested += len(keys)
        h, w, f = mc.serve_prompt(side, keys, args.pages_per_batch, pool, out)
        hit, written, failed = hit + h, written + w, failed + f
        if turn_s:
            time.sleep(turn_s)
    mc.finish_puts(side)
    return {"hit rate %": 100.0 * hit / requested,
            "pages/s": (hit + written) / (time.perf_counter() - t0), "failed puts": failed}


class TimedPuts:
    """A side whose put batches are timed as the client sees them (start + copy + commit)."""

    def __init__(self, side):
        self.side, self.lat = side, []

    def __getattr__(self, name):
        return getattr(self.side, name)

    def put(self, keys, host_ptr, parent=None):
        t0 = time.perf_counter()
        n = self.side.put(keys, host_ptr, parent)
        self.lat.append(time.perf_counter() - t0)
        return n


class ClusterSide(mc.FluxonSide):
    """Master + owner (L, demotion on) + remote_cache (R); the client uses the owner."""

    def __init__(self, args, tmp, local, remote, ranked=False, keep_fetched_copies=True):
        self.procs = []
        budget = f", remote_budget_bytes: {int(remote * args.remote_budget)}" if ranked else ""
        if ranked and not keep_fetched_copies:
            budget += ", keep_fetched_copies: false"
        mport, madmin = free_port(), free_port()
        self._start(args, tmp, "master", f"""
role: master
log_level: warn
master:
  listen_address: "127.0.0.1:{mport}"
  replica_task_placement: {{remote_only_node_roles: [remote_cache],
                            restrict_to_remote_only_node_roles: true}}
admin: {{listen_address: "127.0.0.1:{madmin}", metrics_port: 0}}
""")
        self.sock = os.path.join(tmp, "owner.sock")
        self.admin = free_port()
        self._start(args, tmp, "owner", f"""
role: owner
node_id: 1
log_level: warn
admin: {{listen_address: "127.0.0.1:{self.admin}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{mport}"
  socket_path: {self.sock}
  segment: {{size: {local}}}
  data_address: "127.0.0.1:0"
  local_reserve:
    expected_capacity: {{value_len: {args.value_len}, payload_capacity_bytes: {int(local * 0.9)}}}
  demotion: {{enabled: true, start_ratio: {args.demotion_start}, max_bytes_in_flight: {args.demotion_inflight}{budget}}}
""")
        self.cache_admin = free_port()
        self._start(args, tmp, "remote-cache", f"""
role: remote_cache
node_id: 3
log_level: warn
admin: {{listen_address: "127.0.0.1:{self.cache_admin}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{mport}"
  segment: {{size: {remote}}}
  data_address: "127.0.0.1:0"
  heartbeat_interval_ms: {args.cache_heartbeat_ms}
  local_reserve:
    expected_capacity: {{value_len: {args.value_len}, payload_capacity_bytes: {int(remote * 0.9)}}}
""")
        for _ in range(400):
            if os.path.exists(self.sock):
                break
            time.sleep(0.05)
        self.c = fluxon.KvClient(socket_path=self.sock)
        self.c.prefault_segment()
        self.value_len = args.value_len
        self.threads = args.copy_threads
        self.fluxonctl = str(Path(args.fluxond).with_name("fluxonctl"))
        # The remote_cache registered (a demotion needs a target).
        deadline = time.time() + 20
        while self.cache_stats().get("owner_master_registered", 0) != 1:
            if time.time() > deadline:
                raise SystemExit("the remote_cache never registered")
            time.sleep(0.1)

    def _start(self, args, tmp, name, cfg):
        self.tmp = tmp
        path = os.path.join(tmp, f"{name}.yaml")
        Path(path).write_text(cfg)
        log = open(os.path.join(tmp, f"{name}.log"), "w")
        self.procs.append(subprocess.Popen([args.fluxond, "--config", path], stdout=log,
                                           stderr=subprocess.STDOUT))
        time.sleep(0.3)

    def warnings(self):
        """The daemons' warning and error lines, digits folded, counted by kind (top 6 each):
        what a run's failed demotions and drops were."""
        out = {}
        for name in ("owner", "remote-cache", "master"):
            kinds = {}
            try:
                text = Path(os.path.join(self.tmp, f"{name}.log")).read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if "[warning]" not in line and "[error]" not in line:
                    continue
                msg = line.split("] ", 2)[-1]
                kind = re.sub(r"[0-9a-f]{6,}|\d+", "N", msg)[:160]
                kinds[kind] = kinds.get(kind, 0) + 1
            top = sorted(kinds.items(), key=lambda kv: -kv[1])[:6]
            if top:
                out[name] = top
        return out

    def cache_stats(self):
        r = subprocess.run([self.fluxonctl, "--admin", f"127.0.0.1:{self.cache_admin}", "--json",
                            "stats"], capture_output=True, text=True, timeout=20)
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}

    def close(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)


class MooncakeTwoSegments(mc.MooncakeSide):
    """Mooncake with two global segments: the driven client's (L) and a second client's (R)."""

    def __init__(self, args, pool, local, remote):
        from mooncake.store import MooncakeDistributedStore
        args.capacity_bytes = local
        super().__init__(args, pool)
        self.second = MooncakeDistributedStore()
        rc = self.second.setup("127.0.0.1", "P2PHANDSHAKE", remote, 16 << 20, "tcp", "",
                               "127.0.0.1:50071")
        if rc != 0:
            raise SystemExit(f"mooncake second segment setup failed: {rc}")

    def close(self):
        self.second.close()
        super().close()


def pct(xs, p):
    return float(np.percentile(np.array(xs) * 1e3, p)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--local", default="1GiB", help="bytes (1GiB, 512MiB) or a share of the "
                    "working set (25%%)")
    ap.add_argument("--remote", default="1GiB")
    ap.add_argument("--trace", default=None,
                    help="replay this eviction trace (bench_eviction_policy --dump-traces) instead "
                         "of the multi-turn workload")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--value-len", type=int, default=4_718_592)
    ap.add_argument("--pages-per-batch", type=int, default=128)
    ap.add_argument("--copy-threads", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-turn-pages", type=int, default=16)
    ap.add_argument("--pages-per-turn", type=int, default=8)
    ap.add_argument("--turn-ms", type=float, default=0,
                    help="the GPU's time per turn (per prompt with --trace) between requests "
                         "(0: back to back)")
    ap.add_argument("--demotion-start", type=float, default=0.85,
                    help="the owner's owner.demotion.start_ratio")
    ap.add_argument("--demotion-inflight", default="256MiB",
                    help="the owner's owner.demotion.max_bytes_in_flight")
    ap.add_argument("--remote-budget", type=float, default=0.9,
                    help="owner-L+rc-R-ranked: the owner's remote budget as a share of R")
    ap.add_argument("--cache-heartbeat-ms", type=int, default=1000,
                    help="the remote_cache's heartbeat (it hears of peer reads with each)")
    ap.add_argument("--configs", default="owner-L,owner-L+rc-R,owner-L+R,mooncake-L+R")
    ap.add_argument("--fluxond", default=os.environ.get("FLUXOND", "build/src/fluxond"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    b, v = args.pages_per_batch, args.value_len
    if args.trace:
        from eviction_fluxond_replay import load_trace
        prompts, ws = load_trace(args.trace)
        workload = f"trace {Path(args.trace).stem}: {len(prompts)} prompts"
    else:
        ws = args.sessions * (args.first_turn_pages + (args.turns - 1) * args.pages_per_turn)
        workload = (f"multi-turn: {args.sessions} sessions x {args.turns} turns, "
                    f"{args.first_turn_pages} + {args.pages_per_turn}/turn pages")
    local, remote = parse_bytes(args.local, ws * v), parse_bytes(args.remote, ws * v)
    pool = np.random.default_rng(7).integers(0, 256, size=(b, v), dtype=np.uint8)
    out = np.empty((b, v), dtype=np.uint8)
    print(f"working set {ws} pages of {v} B = {ws * v / 2**30:.2f} GiB; L {args.local} "
          f"({local / 2**20:.0f} MiB, {100 * local / (ws * v):.0f} %), R {args.remote} "
          f"({remote / 2**20:.0f} MiB, {100 * remote / (ws * v):.0f} %)", file=sys.stderr)

    def make(name):
        tmp = tempfile.mkdtemp(prefix="fxcs", dir="/tmp")
        if name == "owner-L":
            args.capacity_bytes = local
            return mc.FluxonSide(args, tmp)
        if name == "owner-L+R":
            args.capacity_bytes = local + remote
            return mc.FluxonSide(args, tmp)
        if name.startswith("owner-L+rc-R"):
            return ClusterSide(args, tmp, local, remote, ranked="-ranked" in name,
                               keep_fetched_copies=not name.endswith("-drop"))
        side = MooncakeTwoSegments(args, pool, local, remote)
        side.s.register_buffer(out.ctypes.data, out.nbytes)
        return side

    class Quiet:
        def update(self, _):
            pass

    configs = args.configs.split(",")
    results = {c: [] for c in configs}
    extra = {}
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for name in order:
            side = make(name)
            timed = TimedPuts(side)
            try:
                res = (replay_trace(timed, prompts, args, pool, out) if args.trace
                       else mc.multiturn(timed, args, pool, out, Quiet()))
                res["put p50 ms"] = pct(timed.lat, 50)
                res["put p99 ms"] = pct(timed.lat, 99)
                if name.startswith("owner-L+rc-R"):
                    s = side.c.stats()
                    extra[f"{name} {r}"] = e = {k: s.get(k, 0) for k in (
                        "demotions_started", "demoted_pages", "demotion_no_space",
                        "demotion_failed", "evicted_pages", "evicted_copied_pages",
                        "remote_get_keys", "remote_ranked_bytes", "remote_drops_dropped",
                        "remote_drops_kept", "remote_drops_not_held", "remote_drops_failed",
                        "remote_duplicate_pages",
                        "relocalised_pages", "eviction_rounds")}
                    cache = side.cache_stats()
                    e["cache_evicted_pages"] = cache.get("owner_evicted_pages", 0)
                    e["cache_dropped_on_request_pages"] = cache.get(
                        "owner_dropped_on_request_pages", 0)
                    # How the demotions' pulls ended at the remote_cache, and the demoting
                    # owner's side of them.
                    for stat, n in sorted(cache.items()):
                        if stat.startswith("owner_replica_pulls_") and n:
                            e["cache_" + stat[len("owner_"):]] = n
                    for stat, n in sorted(s.items()):
                        if stat.startswith("replica_tasks_") and n:
                            e[stat] = n
                    warned = side.warnings()
                    if warned:
                        e["warnings"] = warned
                results[name].append(res)
            finally:
                side.close()
            print(f"round {r + 1}/{args.rounds} {name}: {res['hit rate %']:.1f} % hit, "
                  f"{res['pages/s']:.0f} pages/s, put p99 {res['put p99 ms']:.1f} ms, "
                  f"{res['failed puts']} failed puts", file=sys.stderr, flush=True)
    keys = ["hit rate %", "pages/s", "put p50 ms", "put p99 ms", "failed puts"]
    summary = {c: {k: statistics.median(x[k] for x in rs) for k in keys}
               for c, rs in results.items()}
    print(f"\n{workload} of {v:,} B (working set {ws * v / 2**30:.2f} GiB); "
          f"L = {args.local}, R = {args.remote}; medians of {args.rounds} rounds")
    print("| configuration | hit rate % | pages/s | put p50 ms | put p99 ms | failed puts |")
    print("|---|---|---|---|---|---|")
    for c in configs:
        s = summary[c]
        print(f"| {c} | {s['hit rate %']:.1f} | {s['pages/s']:.0f} | {s['put p50 ms']:.1f} | "
              f"{s['put p99 ms']:.1f} | {s['failed puts']:.0f} |")
    for split in ("owner-L+rc-R", "owner-L+rc-R-ranked", "owner-L+rc-R-ranked-drop"):
        if split in summary and "owner-L+R" in summary:
            ratio = summary[split]["hit rate %"] / max(summary["owner-L+R"]["hit rate %"], 1e-9)
            print(f"{split} hit rate / owner-L+R: {100 * ratio:.0f} %")
    for name, e in sorted(extra.items()):
        print(f"{name} (round) counters: " + ", ".join(
            f"{k} {v}" for k, v in e.items() if k != "warnings"))
        for daemon, kinds in e.get("warnings", {}).items():
            for kind, n in kinds:
                print(f"  {daemon} warned {n}x: {kind}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rounds": results,
                                               "counters": extra}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
