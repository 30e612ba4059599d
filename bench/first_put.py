#!/usr/bin/env python3
"""The first puts of a fresh owner: latency of the first put batches after fluxond says ready.

Starts an embedded fluxond (own config, a 4 GiB segment: 8 grants) per configuration of
`--configs` (warm_grants:seconds, setting owner.local_reserve.warm_grants and the wait after
fluxond's ready line), then times `--batches` put batches of `--pages` values of `--value-len`
bytes (start, copy, commit, wait). Repeats `--rounds` times with a fresh daemon, configurations
alternating, and prints the first batch's and the p99 batch's latency per configuration;
`--busy N` keeps N processes spinning meanwhile (a busy machine).

  PYTHONPATH=build/python python3 bench/first_put.py --rounds 5 --busy 2
"""
import argparse
import ctypes
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))
import fluxon  # noqa: E402


def spin(stop):
    while not stop.is_set():
        pass


def one_round(a, warm, delay):
    d = Path(tempfile.mkdtemp(prefix="fxfirst", dir="/tmp"))
    sock = d / "owner.sock"
    (d / "c.yaml").write_text(f"""
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {sock}
  segment: {{size: 4GiB}}
  local_reserve: {{warm_grants: {warm}}}
""")
    log = d / "log"
    p = subprocess.Popen([a.fluxond, "--config", str(d / "c.yaml")], stdout=open(log, "w"),
                         stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not re.search(r"^fluxond \S+ ready$", log.read_text(), re.M):
            if time.time() > deadline or p.poll() is not None:
                raise SystemExit(log.read_text())
            time.sleep(0.01)
        time.sleep(delay)
        c = fluxon.KvClient(socket_path=str(sock))
        buf = ctypes.create_string_buffer(b"\x01" * (a.pages * a.value_len))
        lat = []
        for b in range(a.batches):
            t0 = time.perf_counter()
            plan = c.local_fast_put_start([f"f{b}-{i}" for i in range(a.pages)], a.value_len)
            fluxon.copy_to_plan(plan, ctypes.addressof(buf), a.value_len)
            c.local_fast_put_commit(plan).wait(60)
            lat.append((time.perf_counter() - t0) * 1e3)
        return lat
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=32)
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--value-len", type=int, default=256 * 1024)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--configs", default="0:0,1:0,1:1",
                    help="warm_grants:seconds after ready, comma separated (a warm_grants of "
                         "the segment's grant count populates all of it before ready)")
    ap.add_argument("--fluxond", default=os.environ.get("FLUXOND",
                                                        str(ROOT / "build/src/fluxond")))
    a = ap.parse_args()
    stop = mp.Event()
    spinners = [mp.Process(target=spin, args=(stop,)) for _ in range(a.busy)]
    for s in spinners:
        s.start()
    try:
        configs = [(int(w), float(d)) for w, d in
                   (c.split(":") for c in a.configs.split(","))]
        first = {cfg: [] for cfg in configs}
        p99 = {cfg: [] for cfg in configs}
        p50 = {cfg: [] for cfg in configs}
        for _ in range(a.rounds):  # alternating configurations
            for cfg in configs:
                lat = one_round(a, *cfg)
                first[cfg].append(lat[0])
                p99[cfg].append(sorted(lat)[max(0, int(len(lat) * 0.99) - 1)])
                p50[cfg].append(statistics.median(lat))
    finally:
        stop.set()
        for s in spinners:
            s.join()
    print(f"{a.rounds} rounds, {a.batches} batches of {a.pages} x {a.value_len} B, busy={a.busy}\n")
    print("| warm_grants | put after ready | first batch ms | p50 batch ms | p99 batch ms |")
    print("|---|---|---|---|---|")
    for cfg in configs:
        print(f"| {cfg[0]} | {cfg[1]:.0f} s | {statistics.median(first[cfg]):.1f} | "
              f"{statistics.median(p50[cfg]):.1f} | {statistics.median(p99[cfg]):.1f} |")
    print("\n(each figure: the median over the rounds)")


if __name__ == "__main__":
    main()
