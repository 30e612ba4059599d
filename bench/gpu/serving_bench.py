#!/usr/bin/env python3
"""Multi-turn serving benchmark: launched SGLang servers, with and without Fluxon (GPU machine).

The workload is SGLang's `benchmark/hicache/bench_multiturn.py` shape, scaled to the device time:
`--clients` conversations of `--rounds` turns; each turn sends the whole conversation so far plus
`--request-len` new tokens and asks for `--output-len` tokens (greedy); requests arrive as a
Poisson process of `--rate` per second, at most `--parallel` in flight, the next conversation
picked at random from those ready, and a round ends when every conversation has had its turn
(round barrier). The model is Llama-3-8B-shaped (32 layers, 8 KV heads x 128, bf16: 128 KiB per
token) with dummy weights, and the GPU KV pool (`--gpu-tokens`) is far smaller than the
conversations, so later rounds need what was evicted from the GPU.

Configurations, each its own server with the same model and GPU pool, and the same host memory
(`--host-gib`, H) where they use any:
- `gpu`: the device radix cache only;
- `gpu-floor`: the device radix cache only, with a GPU pool that holds every conversation whole
  (`floor_tokens`): nothing is ever restored from below the GPU, so its TTFT is the floor that
  no cache below the GPU can beat on this workload (the prefill of the new tokens and the queue);
- `hicache`: SGLang's host L2 of H;
- `fluxon-storage`: host L2 of H/4 and Fluxon as storage backend with a segment of 3H/4;
- `fluxon-linker`: Fluxon's unified cache linker, a segment of H (no host L2);
- `file`: host L2 of H/4 and SGLang's file backend (a directory under /tmp);
- `mooncake`: host L2 of H/4 and Mooncake Store as storage backend (a local `mooncake_master`,
  a 3H/4 segment), only where `--mooncake` points at an installed mooncake-transfer-engine
  (`pip install --no-deps --target DIR mooncake_transfer_engine_cuda13-...whl`, then
  `--mooncake DIR`).

Before the measured rounds each server serves `--warmup` throw-away conversations of two turns
(their own tokens, one request at a time, the second turn after `/flush_cache` so that it is
restored from below the GPU where the configuration can), then `/flush_cache` again: the first
requests of a fresh server pay for kernel compilation and first use of every copy path, which
would otherwise land in round 1 of whichever configuration runs.

Reported per configuration: TTFT (request latency with `--output-len 1`) p50/p99, requests/s,
the cached-token ratio (cached / prompt tokens), the bytes that came from below the GPU
(cached tokens minus device hits, x 128 KiB), and TTFT p50 by round; a CSV of every request and,
where matplotlib imports, a plot of TTFT by round.

    FLUXOND=... PYTHONPATH=<sglang>:<deps>:tests/gpu/standins python3 bench/gpu/serving_bench.py \
        --configs gpu,hicache,fluxon-storage,fluxon-linker --csv out.csv
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
for cand in (os.path.join(HERE, "..", "..", "tests", "gpu"), os.path.join(HERE, "..", "tests")):
    if os.path.exists(os.path.join(cand, "sglang_launch.py")):
        sys.path.insert(0, os.path.abspath(cand))
from sglang_launch import (  # noqa: E402
    Owner, Server, keep_logs, llama_config, wait_ready, write_model)

PAGE = 64
TOKEN_BYTES = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head_dim x bf16
CONFIGS = ("gpu", "gpu-floor", "hicache", "fluxon-storage", "fluxon-linker", "file", "mooncake")


def conversations(clients, rounds, request_len, seed):
    """Each client's new tokens per round (the history is what was sent and answered before)."""
    rng = random.Random(seed)
    return [[[rng.randrange(3, 128000) for _ in range(request_len)] for _ in range(rounds)]
            for _ in range(clients)]


def run_workload(server, turns, a):
    """Runs every round against one server; returns a list of per-request records."""
    clients, rounds = len(turns), len(turns[0])
    history = [[] for _ in range(clients)]
    records = []
    lock = threading.Lock()
    rng = random.Random(a.seed + 1)
    t_start = time.time()
    for r in range(rounds):
        ready = list(range(clients))
        rng.shuffle(ready)
        in_flight = threading.Semaphore(a.parallel)
        threads = []
        errors = []

        def one(c, prompt, r=r):
            try:
                out, meta, secs = server.generate(prompt, a.output_len, timeout=600)
                with lock:
                    history[c] = prompt + out
                    details = meta.get("cached_tokens_details") or {}
                    records.append({
                        "round": r, "client": c, "prompt_tokens": len(prompt),
                        "cached_tokens": int(meta.get("cached_tokens", 0)),
                        "device_tokens": int(details.get("device", 0)),
                        "host_tokens": int(details.get("host", 0)),
                        "storage_tokens": int(details.get("storage", 0)),
                        "ttft_s": secs, "end_s": time.time() - t_start})
            except Exception as e:  # noqa: BLE001 - reported after the round
                errors.append(f"client {c} round {r}: {e}")
            finally:
                in_flight.release()

        next_at = time.time()
        for c in ready:
            next_at += rng.expovariate(a.rate)
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            in_flight.acquire()
            prompt = history[c] + turns[c][r]
            t = threading.Thread(target=one, args=(c, prompt))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout=900)
        if errors:
            raise RuntimeError(f"{server.name}: {len(errors)} failed requests: {errors[:3]}")
    return records, time.time() - t_start


def warm_up(server, a):
    """Serves `a.warmup` two-turn conversations of their own tokens, one request at a time (the
    second turn after a flush of the device cache), then flushes again; returns the seconds."""
    t0 = time.time()
    turns = conversations(a.warmup, 2, a.request_len, a.seed + 1000)
    for conv in turns:
        out, _, _ = server.generate(conv[0], a.output_len, timeout=600)
        server.flush()
        server.generate(conv[0] + out + conv[1], a.output_len, timeout=600)
    server.flush()
    return time.time() - t0


def summary(name, records, wall):
    ttft = sorted(r["ttft_s"] for r in records)
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    below = sum(max(0, r["cached_tokens"] - r["device_tokens"]) for r in records)
    by_round = {}
    for r in records:
        by_round.setdefault(r["round"], []).append(r["ttft_s"])
    return {
        "config": name, "requests": len(records),
        "ttft_p50_ms": 1e3 * ttft[len(ttft) // 2],
        "ttft_p99_ms": 1e3 * ttft[min(len(ttft) - 1, len(ttft) * 99 // 100)],
        "req_per_s": len(records) / wall, "cached_ratio": cached / max(1, prompt),
        "gb_from_below": below * TOKEN_BYTES / 1e9,
        "round_p50_ms": [1e3 * statistics.median(by_round[k]) for k in sorted(by_round)],
    }


def floor_tokens(a):
    """A GPU pool (tokens) that holds every conversation whole: its turns and answers, the
    warm-up's, and a page per request of slack, rounded up to whole pages."""
    conv = a.rounds * (a.request_len + a.output_len)
    warm = 2 * (a.request_len + a.output_len) * a.warmup
    total = a.clients * (conv + PAGE) + warm + a.parallel * PAGE
    return -(-total // PAGE) * PAGE


def server_flags(name, a, tmp, owner, mooncake_cfg):
    host = a.host_gib
    pool = floor_tokens(a) if name == "gpu-floor" else a.gpu_tokens
    common = ["--page-size", str(PAGE), "--max-total-tokens", str(pool),
              "--mem-fraction-static", "0.85", "--max-running-requests", str(a.parallel),
              "--chunked-prefill-size", "8192"]
    l2_small = ["--enable-hierarchical-cache", "--hicache-size", str(max(1, host // 4)),
                "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
                "--hicache-storage-prefetch-policy", "wait_complete"]
    if name in ("gpu", "gpu-floor"):
        return common
    if name == "hicache":
        return common + ["--enable-hierarchical-cache", "--hicache-size", str(host),
                         "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"]
    if name == "fluxon-storage":
        cfg = {"backend_name": "fluxon", "module_path": "fluxon.sglang",
               "class_name": "FluxonHiCacheStorage", "interface_v1": 1, "socket": owner.socket,
               "namespace": "bench"}
        return common + l2_small + ["--hicache-storage-backend", "dynamic",
                                    "--hicache-storage-backend-extra-config", json.dumps(cfg)]
    if name == "fluxon-linker":
        cfg = {"linker": "FluxonLinker", "linker_module_path": "fluxon.sglang_linker",
               "linker_extra_config": {"socket": owner.socket, "namespace": "bench"}}
        return common + ["--enable-unified-cache-external-linker",
                         "--unified-cache-external-linker-backend", "dynamic",
                         "--unified-cache-external-linker-config", json.dumps(cfg)]
    if name == "file":
        path = os.path.join(tmp, "file-store")
        os.makedirs(path, exist_ok=True)
        return common + l2_small + ["--hicache-storage-backend", "file",
                                    "--file-storage-path", path]
    if name == "mooncake":
        return common + l2_small + ["--hicache-storage-backend", "mooncake",
                                    "--hicache-storage-backend-extra-config",
                                    json.dumps(mooncake_cfg)]
    raise ValueError(name)


def mooncake_env(a):
    """Where `--mooncake` is a folder the wheel was installed into with `pip --target`, the
    server (and the master's launcher) import `mooncake` from there."""
    if not a.mooncake or not os.path.isdir(os.path.join(a.mooncake, "mooncake")):
        return {}
    return {"PYTHONPATH": os.pathsep.join(
        p for p in (a.mooncake, os.environ.get("PYTHONPATH", "")) if p)}


def start_mooncake(a, tmp):
    """A local mooncake_master (metadata over its HTTP server); returns (process, config)."""
    # The wheel's own binary (`pip --target DIR`: DIR/mooncake/mooncake_master), else a
    # console script on DIR/bin or PATH.
    master = os.path.join(a.mooncake, "mooncake", "mooncake_master") if a.mooncake else ""
    if not os.access(master, os.X_OK):
        master = shutil.which("mooncake_master", path=os.path.join(a.mooncake, "bin")) \
            or shutil.which("mooncake_master")
    if master is None:
        raise RuntimeError("mooncake_master not found (--mooncake DIR, DIR/bin or PATH)")
    log = open(os.path.join(tmp, "mooncake_master.log"), "w")
    proc = subprocess.Popen([master, "--rpc_port=50551", "--enable_http_metadata_server=true",
                             "--http_metadata_server_port=8089"], stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ, **mooncake_env(a)))
    time.sleep(2)
    seg = (a.host_gib * 3 // 4) << 30
    return proc, {"master_server_address": "127.0.0.1:50551",
                  "metadata_server": "http://127.0.0.1:8089/metadata",
                  "protocol": "tcp", "device_name": "", "local_hostname": "127.0.0.1",
                  "global_segment_size": seg, "local_buffer_size": 1 << 30}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="gpu,hicache,fluxon-storage,fluxon-linker")
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--request-len", type=int, default=2048)
    ap.add_argument("--output-len", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--gpu-tokens", type=int, default=60000,
                    help="the GPU KV pool in tokens (--max-total-tokens)")
    ap.add_argument("--host-gib", type=int, default=24, help="host memory per configuration")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2,
                    help="throw-away two-turn conversations served before the measured rounds")
    ap.add_argument("--mooncake", default="",
                    help="folder of an installed Mooncake (`pip --target DIR`, or a prefix with bin/)")
    ap.add_argument("--ready-timeout", type=int, default=420)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()
    names = [n for n in a.configs.split(",") if n]
    for n in names:
        if n not in CONFIGS:
            ap.error(f"unknown configuration {n!r}; choose from {', '.join(CONFIGS)}")
    tmp = tempfile.mkdtemp(prefix="fluxon-serving-")
    model = write_model(os.path.join(tmp, "model"), llama_config(
        layers=a.layers, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
        vocab=128256))
    turns = conversations(a.clients, a.rounds, a.request_len, a.seed)
    results, all_records = [], []
    try:
        for name in names:  # one server at a time: each has the GPU and the cores to itself
            owner = mooncake = None
            server = None
            try:
                mooncake_cfg = None
                if name.startswith("fluxon"):
                    seg = a.host_gib if name == "fluxon-linker" else a.host_gib * 3 // 4
                    owner = Owner(tmp, f"owner-{name}", segment=f"{seg}GiB").start()
                if name == "mooncake":
                    mooncake, mooncake_cfg = start_mooncake(a, tmp)
                server = Server(tmp, name, model, server_flags(name, a, tmp, owner, mooncake_cfg),
                                env=mooncake_env(a) if name == "mooncake" else None)
                print(f"{name}: ready after {wait_ready({name: server}, a.ready_timeout)}",
                      flush=True)
                if a.warmup > 0:
                    print(f"{name}: warm-up {warm_up(server, a):.1f} s", flush=True)
                records, wall = run_workload(server, turns, a)
                for r in records:
                    r["config"] = name
                all_records += records
                s = summary(name, records, wall)
                results.append(s)
                print(json.dumps(s), flush=True)
            except Exception as e:  # noqa: BLE001 - the next configuration still runs
                print(f"{name}: FAILED: {e}", flush=True)
                if server is not None:
                    print(f"{name}: log tail: {server.tail(20)}", flush=True)
                results.append({"config": name, "error": str(e)[:200]})
            finally:
                if server is not None:
                    server.stop()
                if owner is not None:
                    owner.stop()
                if mooncake is not None:
                    mooncake.terminate()
                    mooncake.wait(timeout=20)
    finally:
        keep_logs(tmp, prefix="bench-")
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n## Multi-turn serving ({a.clients} clients x {a.rounds} rounds, {a.request_len} "
          f"new tokens a turn, output {a.output_len}, {a.parallel} in flight, {a.rate}/s; "
          f"{a.layers}-layer Llama-3-8B shape, GPU pool {a.gpu_tokens} tokens, host {a.host_gib} "
          f"GiB)\n")
    print("| config | TTFT p50 ms | TTFT p99 ms | req/s | cached ratio | GB from below GPU | "
          "TTFT p50 by round (ms) |")
    print("|---|---|---|---|---|---|---|")
    for s in results:
        if "error" in s:
            print(f"| {s['config']} | FAILED: {s['error'][:60]} | | | | | |")
            continue
        rounds = " / ".join(f"{x:.0f}" for x in s["round_p50_ms"])
        print(f"| {s['config']} | {s['ttft_p50_ms']:.1f} | {s['ttft_p99_ms']:.1f} | "
              f"{s['req_per_s']:.2f} | {s['cached_ratio']:.3f} | {s['gb_from_below']:.1f} | "
              f"{rounds} |")
    if a.csv and all_records:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(all_records[0].keys()))
            w.writeheader()
            w.writerows(all_records)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            for s in results:
                if "round_p50_ms" in s:
                    plt.plot(range(1, len(s["round_p50_ms"]) + 1), s["round_p50_ms"],
                             marker="o", label=s["config"])
            plt.xlabel("round")
            plt.ylabel("TTFT p50 (ms)")
            plt.legend()
            plt.savefig(a.plot, dpi=120)
        except ImportError:
            print("matplotlib not importable: no plot")
    return 0 if results and all("error" not in s for s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
