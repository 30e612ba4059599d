#!/usr/bin/env python3
"""Whether a change to the owner's policy moved the suite's counts by more than the seeds do.

Reads two `bench_eviction_suite --csv` files of the same sweep (before, after) and, for each half
of the seeds, counts the owner's policy's cells at or above the best of page LRU, S3-FIFO and ARC,
more than 0.5 below it, barrier cells below the previous policy and barrier cells within 3 of
Belady at 50 %, before and after. Each difference comes with a 95 % interval from a paired
bootstrap over the traces (a trace's four capacities move together, so a trace is what is
resampled): a change whose interval holds 0 is within what another draw of seeds would give.

  build/bench/bench_eviction_suite --threads 2 --csv before.csv   # the tree before
  build/bench/bench_eviction_suite --threads 2 --csv after.csv    # the tree after
  python3 bench/eviction_suite_compare.py before.csv after.csv [--rounds 2000] [--seed 1]
"""
import argparse
import collections
import csv
import random
import sys

from eviction_suite_bounds import EPS, RATES, best_baseline

COUNTS = [
    ("at or above the best baseline", lambda r: r["adaptive"] >= best_baseline(r) - EPS),
    ("more than 0.5 below", lambda r: r["adaptive"] < best_baseline(r) - 0.5 - EPS),
    ("barrier: below the previous policy",
     lambda r: r["family"] == "barrier" and r["adaptive"] < r["previous"] - EPS),
    ("barrier: within 3 of Belady at 50 %",
     lambda r: r["family"] == "barrier" and r["capacity_pct"] == "50"
     and r["adaptive"] >= r["belady"] - 3 - EPS),
]


def load(path):
    cells = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in RATES:
                r[k] = float(r[k])
            cells[(r["family"], r["params"], r["seed"], r["capacity_pct"])] = r
    if not cells:
        sys.exit("no cells in " + path)
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=1, help="the bootstrap's random seed")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    before, after = load(args.before), load(args.after)
    if before.keys() != after.keys():
        sys.exit("the two files do not hold the same cells (same sweep, same options?)")
    rng = random.Random(args.seed)
    for half, name in (("1", "held-out"), ("0", "tuning")):
        # Per trace: the change in each count over its capacities.
        traces = collections.defaultdict(lambda: [0] * (2 * len(COUNTS)))
        for key, b in before.items():
            if b["held_out"] != half:
                continue
            a = after[key]
            t = traces[key[:3]]
            for i, (_, test) in enumerate(COUNTS):
                t[2 * i] += test(b)
                t[2 * i + 1] += test(a)
        if not traces:
            continue
        rows = list(traces.values())
        n = len(rows)
        print(f"{name} half: {n} traces, {sum(1 for k in before if before[k]['held_out'] == half)} "
              f"cells; difference after - before with a 95 % interval (paired bootstrap over "
              f"traces, {args.rounds} resamples)\n")
        print("| count | before | after | difference | 95 % interval |")
        print("|---|---|---|---|---|")
        for i, (label, _) in enumerate(COUNTS):
            deltas = [r[2 * i + 1] - r[2 * i] for r in rows]
            total_b = sum(r[2 * i] for r in rows)
            total_a = sum(r[2 * i + 1] for r in rows)
            sums = sorted(sum(deltas[rng.randrange(n)] for _ in range(n))
                          for _ in range(args.rounds))
            lo = sums[int(0.025 * (args.rounds - 1))]
            hi = sums[int(0.975 * (args.rounds - 1))]
            print(f"| {label} | {total_b} | {total_a} | {total_a - total_b:+d} | {lo:+d} to {hi:+d} |")
        print()


if __name__ == "__main__":
    main()
