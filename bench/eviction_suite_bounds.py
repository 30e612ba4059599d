#!/usr/bin/env python3
"""What choosing among the suite's policies could reach, from `bench_eviction_suite --csv`.

For one half of the seeds (tuning by default), counts the cells at or above the best of page LRU,
S3-FIFO and ARC (and more than 0.5 below it; on barrier traffic, below the previous policy) for
the owner's policy, for the previous policy, and for a perfect switch between policies (the best
of them chosen per cell after the fact): the bound an online choice among them cannot pass.
Then the barrier cells that neither the owner's policy nor the previous one brings within 0.5 of
the best baseline, by shared system prompts, parallel groups and capacity, with the baseline
that wins them.

  build/bench/bench_eviction_suite --threads 2 --csv cells.csv
  python3 bench/eviction_suite_bounds.py cells.csv [--held-out]
"""
import argparse
import collections
import csv
import sys

RATES = ["lru", "s3fifo", "arc", "previous", "adaptive", "prediction_alone", "belady"]
EPS = 1e-9

CHOICES = [
    ("the owner's policy", lambda r: r["adaptive"]),
    ("the previous policy", lambda r: r["previous"]),
    ("best of owner's and previous", lambda r: max(r["adaptive"], r["previous"])),
    ("best of owner's and its prediction expert", lambda r: max(r["adaptive"], r["prediction_alone"])),
    ("best of every online policy", lambda r: max(r[k] for k in RATES[:5])),
]


def best_baseline(r):
    return max(r["lru"], r["s3fifo"], r["arc"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--held-out", action="store_true", help="the held-out half instead")
    args = ap.parse_args()
    half = "1" if args.held_out else "0"
    rows = []
    with open(args.csv, newline="") as f:
        for r in csv.DictReader(f):
            if r["held_out"] != half:
                continue
            for k in RATES:
                r[k] = float(r[k])
            rows.append(r)
    if not rows:
        sys.exit("no cells of that half in " + args.csv)
    families = sorted({r["family"] for r in rows})
    print(f"{'held-out' if args.held_out else 'tuning'} half, {len(rows)} cells: at or above the "
          "best baseline / more than 0.5 below (barrier: below the previous policy)\n")
    print("| choice | " + " | ".join(families) + " | all |")
    print("|---" * (len(families) + 2) + "|")
    for name, pick in CHOICES:
        per = collections.defaultdict(lambda: [0, 0, 0])
        for r in rows:
            v, bb = pick(r), best_baseline(r)
            for key in (r["family"], "all"):
                p = per[key]
                p[0] += v >= bb - EPS
                p[1] += v < bb - 0.5 - EPS
                p[2] += r["family"] == "barrier" and v < r["previous"] - EPS
        cells = []
        for key in families + ["all"]:
            a, b, c = per[key]
            cells.append(f"{a} / {b}" + (f" ({c})" if key in ("barrier", "all") else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")

    groups = collections.Counter()
    totals = collections.Counter()
    winners = collections.Counter()
    for r in rows:
        if r["family"] != "barrier":
            continue
        p = dict(kv.split("=") for kv in r["params"].split())
        key = (p["system"], p["parallel"], int(r["capacity_pct"]))
        totals[key] += 1
        bb = best_baseline(r)
        if max(r["adaptive"], r["previous"]) < bb - 0.5 - EPS:
            groups[key] += 1
            winners[min(("lru", "s3fifo", "arc"), key=lambda k: (-r[k], k))] += 1
    print(f"\nbarrier cells that neither the owner's policy nor the previous one brings within 0.5 "
          f"of the best baseline: {sum(groups.values())} of {sum(totals.values())}\n")
    print("| system prompts | parallel groups | capacity | cells |")
    print("|---|---|---|---|")
    for key in sorted(totals):
        print(f"| {key[0]} | {key[1]} | {key[2]} % | {groups[key]} of {totals[key]} |")
    print("\nthe best baseline there: " +
          ", ".join(f"{k} {n}" for k, n in winners.most_common()))


if __name__ == "__main__":
    main()
