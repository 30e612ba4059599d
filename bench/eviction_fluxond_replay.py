#!/usr/bin/env python3
"""Replays the eviction acceptance traces through a real embedded fluxond.

The traces come from the in-memory replay bench, so both replay the same prompts:

    build/bench/bench_eviction_policy --dump-traces /tmp/evtraces > /tmp/evtraces/inmemory.md
    PYTHONPATH=build/python python3 bench/eviction_fluxond_replay.py --traces-dir /tmp/evtraces \\
        --fluxond new=build/src/fluxond [--fluxond old=/path/to/older/fluxond] \\
        --traces cyclic,zipf1.1 --capacities 10,25

For every (trace, capacity, binary) a fresh fluxond starts with one 512 MiB grant whose slot size
and hot_capacity_ratio make its watermark hold `capacity` % of the trace's working set in pages
(the expected-capacity cap; 64 pages of headroom for puts in flight). Each prompt is served as
SGLang's HiCache does: probe the longest stored prefix (get_start, cancel), read it (get_start,
get_transfer, release_views), then put the missing pages in batches of at most 128 with
`parent_key` naming the page before the batch (a KeyConflictError keeps the stored pages and
writes the others). Values are not copied (hit rates only). Prints a markdown table.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import fluxon

GRANT = 512 << 20
HEADROOM = 64


def load_trace(path):
    prompts, distinct = [], 0
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                distinct = int(line.split("working set")[1].split()[0])
                continue
            prompts.append([int(x) for x in line.split()])
    return prompts, distinct


def sizing(pages):
    """Slot size (4 KiB multiple) giving one grant at least pages + HEADROOM slots, and the
    hot_capacity_ratio that puts the watermark at `pages` slots."""
    slot = 4096 * (GRANT // (4096 * (pages + HEADROOM)))
    slots = GRANT // slot
    return slot, pages / slots, slots


class Daemon:
    def __init__(self, binary, pages, tmp):
        self.slot, ratio, self.slots = sizing(pages)
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
  segment: {{size: {GRANT}}}
  hot_capacity_ratio: {ratio:.6f}
  local_reserve:
    expected_capacity: {{value_len: {self.slot}, payload_capacity_bytes: {self.slots * self.slot}}}
""")
        self.proc = subprocess.Popen([binary, "--config", cfg], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        for _ in range(600):
            if os.path.exists(self.sock) or self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.proc.poll() is not None:
            raise SystemExit(f"fluxond exited: {self.proc.stderr.read().decode()}")
        self.c = fluxon.KvClient(socket_path=self.sock)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def replay(d, prompts, tag, batch=128):
    c, v = d.c, d.slot
    requested = hit = failed = 0
    last = None
    for prompt in prompts:
        keys = [f"{tag}:{p}" for p in prompt]
        requested += len(keys)
        # Probe (batch_exists), then read (batch_get): two accesses, as SGLang's are.
        prefix = 0
        while prefix < len(keys):
            chunk = keys[prefix:prefix + batch]
            h = c.get_start(chunk)
            n = h.result.raw_prefix_hit_len
            c.cancel_get_transfer(h)
            if n == 0:
                break
            h = c.get_start(chunk[:n])
            got = h.result.transferable_len
            if got == 0:
                c.cancel_get_transfer(h)
                break
            c.release_views(c.get_transfer(h))
            prefix += got
            if got < len(chunk):
                break
        hit += prefix
        i = prefix
        while i < len(keys):
            chunk = keys[i:i + batch]
            parent = keys[i - 1] if i > 0 else None
            try:
                plan = c.local_fast_put_start(chunk, v, fluxon.PutOptionalArgs(parent_key=parent))
                last = c.local_fast_put_commit(plan)
                i += len(chunk)
            except fluxon.KeyConflictError as e:
                # Stored already (past a missing page): keep those, write the ones before them.
                first = min(e.conflict_indices)
                if first == 0:
                    i += 1
                    continue
                try:
                    plan = c.local_fast_put_start(chunk[:first], v,
                                                  fluxon.PutOptionalArgs(parent_key=parent))
                    last = c.local_fast_put_commit(plan)
                except (fluxon.KeyConflictError, fluxon.NoSpaceError):
                    failed += first
                i += first
            except fluxon.NoSpaceError:
                failed += len(chunk)
                i += len(chunk)
    if last is not None:
        last.wait(30)
    s = c.stats()
    return 100.0 * hit / requested, failed, s.get("evicted_pages", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces-dir", required=True)
    ap.add_argument("--traces", default="cyclic,zipf1.1")
    ap.add_argument("--capacities", default="10,25,50")
    ap.add_argument("--fluxond", action="append", default=[],
                    help="label=path (repeatable); default new=build/src/fluxond")
    args = ap.parse_args()
    binaries = [b.split("=", 1) for b in (args.fluxond or ["new=build/src/fluxond"])]
    rows = []
    for name in args.traces.split(","):
        prompts, distinct = load_trace(os.path.join(args.traces_dir, f"{name}.trace"))
        for pct in [int(x) for x in args.capacities.split(",")]:
            pages = distinct * pct // 100
            row = [name, f"{pct} % ({pages})"]
            for label, binary in binaries:
                tmp = tempfile.mkdtemp(prefix="fxev", dir="/tmp")
                t0 = time.perf_counter()
                d = Daemon(binary, pages, tmp)
                try:
                    rate, failed, evicted = replay(d, prompts, f"{name}-{pct}")
                finally:
                    d.close()
                    shutil.rmtree(tmp, ignore_errors=True)
                print(f"{name} {pct}% {label}: {rate:.1f}% hit, {failed} failed puts, {evicted} "
                      f"evicted, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
                row.append(f"{rate:.1f}" + (f" ({failed} failed puts)" if failed else ""))
            rows.append(row)
    print("\n| trace | capacity (pages) | " + " | ".join(l for l, _ in binaries) + " |")
    print("|---|---|" + "---|" * len(binaries))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
