#!/usr/bin/env python3
"""A HiCache-like workload against a running fluxond, through the fluxon Python client.

Many sessions take turns (cyclic multi-turn traffic): each turn's prompt is the session's whole
previous context plus new pages. For every turn the workload does what SGLang's HiCache does with
its storage backend: look up the longest stored prefix (get_start), restore those pages
(get_transfer + copy + release_views), "compute" the rest, and back up the new pages
(local_fast_put_start + copy + local_fast_put_commit) in batches of up to 128 pages. Page keys
are chained hashes, pages carry a per-key tag that is verified on every restore.

Prints hit rate, pages/s, GB/s and p50/p99 latencies of put and get batches.
"""

import argparse
import hashlib
import sys
import time

import numpy as np

import fluxon


def chain_key(parent: str, session: int, index: int) -> str:
    return hashlib.sha1(f"{parent}|{session}|{index}".encode()).hexdigest()


def pct(values, p):
    return float(np.percentile(values, p)) * 1e3 if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default=None, help="owner socket (default: fluxon's default)")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-turn-pages", type=int, default=16)
    ap.add_argument("--pages-per-turn", type=int, default=8)
    ap.add_argument("--value-len", type=int, default=4_718_592,
                    help="bytes per page value (default: 36 layers x 8 heads x 128 dims bf16, 64 tokens)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--copy-threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    client = fluxon.KvClient(socket_path=args.socket)
    v = args.value_len
    rng = np.random.default_rng(args.seed)
    # A GPU KV cache stand-in: page bytes come from here, restored pages land here.
    staging = rng.integers(0, 256, size=(args.batch, v), dtype=np.uint8)
    restore = np.empty((args.batch, v), dtype=np.uint8)

    contexts = [[] for _ in range(args.sessions)]
    requested = hit = written = conflicts = verify_failures = 0
    put_lat, put_lat_nocopy, get_lat, get_lat_nocopy = [], [], [], []
    bytes_in = bytes_out = 0
    t_start = time.perf_counter()
    for turn in range(args.turns):
        for s in range(args.sessions):
            ctx = contexts[s]
            new = args.first_turn_pages if turn == 0 else args.pages_per_turn
            for _ in range(new):
                ctx.append(chain_key(ctx[-1] if ctx else "root", s, len(ctx)))
            requested += len(ctx)
            # 1. Longest stored prefix, restored batch by batch until the first miss.
            prefix = 0
            while prefix < len(ctx):
                keys = ctx[prefix:prefix + args.batch]
                t0 = time.perf_counter()
                h = client.get_start(keys)
                n = h.result.transferable_len
                if n == 0:
                    client.cancel_get_transfer(h)
                    break
                plan = client.get_transfer(h)
                t1 = time.perf_counter()
                fluxon.copy_from_plan(plan, restore.ctypes.data, v, args.copy_threads)
                t2 = time.perf_counter()
                client.release_views(plan)
                t3 = time.perf_counter()
                get_lat.append(t3 - t0)
                get_lat_nocopy.append((t1 - t0) + (t3 - t2))
                for i in range(n):
                    tag = int.from_bytes(bytes.fromhex(keys[i][:16]), "little")
                    if int(restore[i, :8].view(np.uint64)[0]) != tag:
                        verify_failures += 1
                bytes_out += n * v
                prefix += n
                if n < len(keys):
                    break
            hit += prefix
            # 2. Back up the pages past the stored prefix.
            missing = ctx[prefix:]
            for b in range(0, len(missing), args.batch):
                keys = missing[b:b + args.batch]
                for i, k in enumerate(keys):  # the "computed" KV carries its key's tag
                    staging[i, :8].view(np.uint64)[0] = int.from_bytes(bytes.fromhex(k[:16]), "little")
                t0 = time.perf_counter()
                try:
                    plan = client.local_fast_put_start(keys, v)
                except fluxon.KeyConflictError:
                    conflicts += 1
                    continue
                t1 = time.perf_counter()
                fluxon.copy_to_plan(plan, staging.ctypes.data, v, args.copy_threads)
                t2 = time.perf_counter()
                fut = client.local_fast_put_commit(plan)
                t3 = time.perf_counter()
                put_lat.append(t3 - t0)
                put_lat_nocopy.append((t1 - t0) + (t3 - t2))
                written += len(keys)
                bytes_in += len(keys) * v
                del fut  # publish completes in the background
    elapsed = time.perf_counter() - t_start
    stats = client.stats()

    print()
    print(f"HiCache-like workload: {args.sessions} sessions x {args.turns} turns, "
          f"{v} B pages, batches <= {args.batch}")
    print(f"  requested pages   {requested}")
    print(f"  hit pages         {hit}   hit rate {100.0 * hit / max(1, requested):.1f}%")
    print(f"  written pages     {written}   conflicts {conflicts}")
    print(f"  restore checks    {'all pages verified' if verify_failures == 0 else f'{verify_failures} FAILED'}")
    print(f"  elapsed           {elapsed:.2f} s")
    print(f"  pages/s           {(hit + written) / elapsed:.0f}  (restored + written)")
    print(f"  GB/s              get {bytes_out / elapsed / 1e9:.2f}  put {bytes_in / elapsed / 1e9:.2f}")
    print(f"  get batch ms      p50 {pct(get_lat, 50):.3f}  p99 {pct(get_lat, 99):.3f}   "
          f"(excl. copy p50 {pct(get_lat_nocopy, 50):.3f}  p99 {pct(get_lat_nocopy, 99):.3f})")
    print(f"  put batch ms      p50 {pct(put_lat, 50):.3f}  p99 {pct(put_lat, 99):.3f}   "
          f"(excl. copy p50 {pct(put_lat_nocopy, 50):.3f}  p99 {pct(put_lat_nocopy, 99):.3f})")
    print(f"  owner             evicted pages {stats['evicted_pages']}, "
          f"committed {stats['slots_Committed']}, grants {stats['grants']}/{stats['grant_capacity']}")
    return 1 if verify_failures else 0


if __name__ == "__main__":
    sys.exit(main())
