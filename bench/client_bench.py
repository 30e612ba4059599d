#!/usr/bin/env python3
"""Control-path latency of the hostless API through the Python client (no data copy):
get cycle (get_start + get_transfer + release_views on local hits) and put cycle
(local_fast_put_start + local_fast_put_commit) for batches of 1, 32 and 128 pages.

    PYTHONPATH=build/python python3 bench/client_bench.py --socket /tmp/fluxon/owner.sock
"""

import argparse
import os
import time

import numpy as np

import fluxon


def pct(xs, p):
    return float(np.percentile(np.array(xs) * 1e6, p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default=None)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--value-len", type=int, default=4096)
    args = ap.parse_args()
    c = fluxon.KvClient(socket_path=args.socket)
    tag = f"pyb{os.getpid()}"
    print(f"{'cycle':<10}{'pages':>6}{'p50 us':>10}{'p99 us':>10}")
    for n in (1, 32, 128):
        keys = [f"{tag}-hit{n}-{i}" for i in range(n)]
        c.local_fast_put_commit(c.local_fast_put_start(keys, args.value_len)).wait(10)
        lat = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            h = c.get_start(keys)
            plan = c.get_transfer(h)
            c.release_views(plan)
            lat.append(time.perf_counter() - t0)
        print(f"{'get':<10}{n:>6}{pct(lat, 50):>10.1f}{pct(lat, 99):>10.1f}")
    for n in (1, 32, 128):
        lat, futs = [], []
        for it in range(min(args.iters, 1000)):
            keys = [f"{tag}-put{n}-{it}-{i}" for i in range(n)]
            t0 = time.perf_counter()
            plan = c.local_fast_put_start(keys, args.value_len)
            futs.append(c.local_fast_put_commit(plan))
            lat.append(time.perf_counter() - t0)
        for f in futs:
            f.wait(10)
        print(f"{'put':<10}{n:>6}{pct(lat, 50):>10.1f}{pct(lat, 99):>10.1f}")


if __name__ == "__main__":
    main()
