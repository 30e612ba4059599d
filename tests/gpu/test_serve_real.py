"""Launched SGLang servers with Fluxon, checked over HTTP (GPU machine; scripts/gpu-run.sh serve).

Four real `python -m sglang.launch_server` processes share the GPU, all with the same 2-layer
Llama shape and the same dummy weights (SGLang seeds them per parameter):

- `plain`: no cache at all (`--disable-radix-cache`), the reference outputs;
- `storage-a` and `storage-b`: HiCache with Fluxon as storage backend, both on owner A;
- `linker`: the unified cache linker over owner B.

Checks: a repeated prompt after `/flush_cache` comes back from Fluxon (`cached_tokens_details`),
greedy outputs equal the reference, the owners' key counts equal the whole pages the servers
cached, the second server restores what the first offloaded, owner B killed (-9) and restarted
under the running linker server (requests keep being answered, as misses, then hits resume), and
no server log has a traceback.

Env: FLUXOND (fluxond of the wheel under test; fluxonctl beside it), PYTHONPATH with SGLang's
sources, the modules it imports and tests/gpu/standins (test stand-ins for SGLang's kernel wheel,
see standins/sitecustomize.py). SERVE_KEEP=DIR keeps the logs there.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_harness import Checks  # noqa: E402
from sglang_launch import (  # noqa: E402
    Owner, Server, keep_logs, llama_config, wait_ready, write_model)

PAGE = 64
PROMPT_TOKENS = 1000  # 15 whole pages and 40 tokens: 960 tokens can come back from a store
PAGES_PER_PROMPT = 15
NEW_TOKENS = 8
PROMPTS = 4
VOCAB = 32000
READY_TIMEOUT_S = 330

MODEL_CONFIG = llama_config(layers=2, hidden=1024, heads=8, kv_heads=8, head_dim=128,
                            intermediate=2816, vocab=VOCAB)

SERVER_FLAGS = ["--page-size", str(PAGE), "--mem-fraction-static", "0.75",
                "--max-total-tokens", "16384"]


def cached(meta) -> tuple[int, dict]:
    return int(meta.get("cached_tokens", 0)), meta.get("cached_tokens_details") or {}


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="fluxon-serve-")
    model_dir = write_model(os.path.join(tmp, "model"), MODEL_CONFIG)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]
    extra_prompts = [[rng.randrange(3, VOCAB) for _ in range(PROMPT_TOKENS)] for _ in range(4)]

    checks = Checks()
    owner_a, owner_b = Owner(tmp, "owner-a"), Owner(tmp, "owner-b")
    servers = {}
    state = {}
    try:
        owner_a.start()
        owner_b.start()
        storage_cfg = json.dumps({
            "backend_name": "fluxon", "module_path": "fluxon.sglang",
            "class_name": "FluxonHiCacheStorage", "interface_v1": 1,
            "socket": owner_a.socket, "namespace": "serve"})
        storage = ["--enable-hierarchical-cache", "--hicache-io-backend", "direct",
                   "--hicache-mem-layout", "layer_first", "--hicache-storage-backend", "dynamic",
                   "--hicache-storage-backend-extra-config", storage_cfg,
                   "--hicache-storage-prefetch-policy", "wait_complete"]
        linker_cfg = json.dumps({
            "linker": "FluxonLinker", "linker_module_path": "fluxon.sglang_linker",
            "linker_extra_config": {"socket": owner_b.socket, "namespace": "serve",
                                    "reconnect_interval_s": 0.5}})
        linker = ["--enable-unified-cache-external-linker",
                  "--unified-cache-external-linker-backend", "dynamic",
                  "--unified-cache-external-linker-config", linker_cfg]
        # All four start together (start-up is mostly CPU and compile time).
        for name, extra in (("plain", ["--disable-radix-cache"]), ("storage-a", storage),
                            ("storage-b", storage), ("linker", linker)):
            servers[name] = Server(tmp, name, model_dir, SERVER_FLAGS + extra)

        checks("4 servers launched and healthy", lambda: wait_ready(servers, READY_TIMEOUT_S))
        if any(r[1] != "PASS" for r in checks.results):
            return checks.report("launched SGLang servers with fluxon")

        def reference():
            plain = servers["plain"]
            state["ref"] = [plain.generate(p, NEW_TOKENS)[0] for p in prompts]
            state["ref_extra"] = [plain.generate(p, NEW_TOKENS)[0] for p in extra_prompts]
            return f"{len(prompts) + len(extra_prompts)} greedy outputs of {NEW_TOKENS} tokens"

        checks("reference outputs (no cache)", reference)

        def round_trip(server_name, owner, source_key):
            """Cold, device hit, flush, restore: the restore comes from the store."""
            s = servers[server_name]
            cold, dev, rest = [], [], []
            for p in prompts:
                cold.append(s.generate(p, NEW_TOKENS))
            for p in prompts:
                dev.append(s.generate(p, NEW_TOKENS))
            keys = owner.wait_keys(PAGES_PER_PROMPT * PROMPTS)
            s.flush()
            for p in prompts:
                rest.append(s.generate(p, NEW_TOKENS))
            state[server_name] = {"cold": cold, "dev": dev, "rest": rest, "keys": keys}
            if keys != PAGES_PER_PROMPT * PROMPTS:
                raise AssertionError(f"owner holds {keys} keys, the server cached "
                                     f"{PAGES_PER_PROMPT * PROMPTS} whole pages")
            for i, (out, meta, _) in enumerate(cold):
                assert cached(meta)[0] == 0, f"prompt {i}: cold request had {cached(meta)}"
            for i, (out, meta, _) in enumerate(dev):
                n, det = cached(meta)
                assert n >= PAGES_PER_PROMPT * PAGE, f"prompt {i}: device hit only {n} ({det})"
            restored = 0
            for i, (out, meta, _) in enumerate(rest):
                n, det = cached(meta)
                if n != PAGES_PER_PROMPT * PAGE:
                    raise AssertionError(f"prompt {i}: restored {n} tokens, want "
                                         f"{PAGES_PER_PROMPT * PAGE} ({det})")
                if source_key is not None and int(det.get(source_key, 0)) != n:
                    raise AssertionError(f"prompt {i}: {n} cached tokens, {det}: not from "
                                         f"{source_key}")
                restored += n
            t_cold = sorted(m[2] for m in cold)[len(cold) // 2]
            t_rest = sorted(m[2] for m in rest)[len(rest) // 2]
            return (f"{restored} tokens restored, {keys} keys; request p50 cold "
                    f"{t_cold * 1e3:.0f} ms, restored {t_rest * 1e3:.0f} ms")

        checks("storage backend: restore after /flush_cache",
               lambda: round_trip("storage-a", owner_a, "storage"))
        checks("linker: restore after /flush_cache",
               lambda: round_trip("linker", owner_b, None))

        def same_outputs(server_name):
            st = state[server_name]
            ref = state["ref"]
            bad = [(kind, i) for kind in ("cold", "dev", "rest")
                   for i, (out, _, _) in enumerate(st[kind]) if out != ref[i]]
            if bad:
                raise AssertionError(f"outputs differ from the reference at {bad[:6]}: "
                                     f"{st['rest'][bad[0][1]][0]} vs {ref[bad[0][1]]}")
            return f"{3 * len(ref)} outputs equal the reference"

        checks("storage backend: greedy outputs equal no-cache",
               lambda: same_outputs("storage-a"))
        checks("linker: greedy outputs equal no-cache", lambda: same_outputs("linker"))

        def second_server():
            s = servers["storage-b"]
            before = owner_a.keys()
            restored = 0
            for i, p in enumerate(prompts):
                out, meta, _ = s.generate(p, NEW_TOKENS)
                n, det = cached(meta)
                if n != PAGES_PER_PROMPT * PAGE or int(det.get("storage", 0)) != n:
                    raise AssertionError(f"prompt {i}: second server cached {n} ({det})")
                if out != state["ref"][i]:
                    raise AssertionError(f"prompt {i}: output differs from the reference")
                restored += n
            after = owner_a.wait_keys(before, timeout_s=5)
            if after != before:
                raise AssertionError(f"owner keys {before} -> {after}: pages stored twice")
            return f"{restored} tokens from the first server's pages; keys stay {after}"

        checks("two servers share one owner", second_server)

        def owner_restart():
            s = servers["linker"]
            owner_b.kill9()
            s.flush()
            # Owner gone: answered, as misses.
            for i in range(2):
                out, meta, _ = s.generate(prompts[i], NEW_TOKENS)
                if cached(meta)[0] != 0:
                    raise AssertionError(f"hit {cached(meta)} with the owner down")
                if out != state["ref"][i]:
                    raise AssertionError("output differs with the owner down")
            owner_b.start()
            # Hits resume: a new prompt is offloaded to the new owner and restored after a
            # flush (the first offload after the restart may find the old connection broken).
            for attempt in range(4):
                p = extra_prompts[attempt]
                s.generate(p, NEW_TOKENS)
                owner_b.wait_keys(PAGES_PER_PROMPT, timeout_s=5)
                s.flush()
                out, meta, _ = s.generate(p, NEW_TOKENS)
                if cached(meta)[0] == PAGES_PER_PROMPT * PAGE:
                    if out != state["ref_extra"][attempt]:
                        raise AssertionError("restored output differs from the reference")
                    return (f"misses while down; hits resumed on attempt {attempt + 1}, "
                            f"new owner holds {owner_b.keys()} keys")
                s.flush()
            raise AssertionError("no hit within 4 attempts after the owner restarted")

        checks("owner kill -9 and restart under the linker server", owner_restart)

        def fluxon_counters():
            sa, sb = owner_a.stats(), owner_b.stats()
            put_a = int(sa.get("owner_put_pages", 0))
            if put_a != PAGES_PER_PROMPT * PROMPTS:
                raise AssertionError(f"owner A put {put_a} pages, the servers cached "
                                     f"{PAGES_PER_PROMPT * PROMPTS}")
            return (f"owner A: put {put_a} pages, hits {sa.get('owner_hits')}; owner B "
                    f"(restarted): put {sb.get('owner_put_pages')}, hits {sb.get('owner_hits')}")

        checks("fluxon counters agree with the served pages", fluxon_counters)

        def no_tracebacks():
            bad = {n: s.tracebacks() for n, s in servers.items() if s.tracebacks()}
            for n, s in servers.items():
                if s.proc.poll() is not None:
                    bad[n] = f"exited {s.proc.returncode}"
            if bad:
                raise AssertionError(f"tracebacks or exits: {bad}")
            return "no traceback in 4 server logs; all still running"

        checks("no errors in the server logs", no_tracebacks)
    finally:
        for s in servers.values():
            s.stop()
        owner_a.stop()
        owner_b.stop()
        keep_logs(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    return checks.report("launched SGLang servers with fluxon")


if __name__ == "__main__":
    sys.exit(main())
