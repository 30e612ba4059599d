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
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_harness import Checks  # noqa: E402

PAGE = 64
PROMPT_TOKENS = 1000  # 15 whole pages and 40 tokens: 960 tokens can come back from a store
PAGES_PER_PROMPT = 15
NEW_TOKENS = 8
PROMPTS = 4
VOCAB = 32000
READY_TIMEOUT_S = 330

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}

SERVER_FLAGS = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--attention-backend", "triton",
    "--sampling-backend", "pytorch", "--grammar-backend", "none",
    "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
    "--page-size", str(PAGE), "--mem-fraction-static", "0.75", "--max-total-tokens", "16384",
    "--random-seed", "0",
]

SERVER_ENV = {
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",  # the wheel's Rust core needs torch 2.14
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Owner:
    """One embedded fluxond on its own socket and admin port; kill -9 and restart in place."""

    def __init__(self, tmp, name):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "owner.sock")
        self.admin = f"127.0.0.1:{free_port()}"
        self.config = os.path.join(self.dir, "fluxond.yaml")
        with open(self.config, "w") as f:
            f.write(f"""role: embedded
log_level: info
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "{self.admin}", metrics_port: 0}}
owner:
  socket_path: {self.socket}
  segment: {{size: 2GiB}}
""")
        self.fluxond = os.environ.get("FLUXOND", "fluxond")
        self.fluxonctl = os.path.join(os.path.dirname(self.fluxond), "fluxonctl") \
            if os.path.dirname(self.fluxond) else "fluxonctl"
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.dir, f"fluxond.{self.starts}.log"), "w")
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self.proc = subprocess.Popen([self.fluxond, "--config", self.config], stdout=log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline:
            if os.path.exists(self.socket):
                try:
                    self.ctl("status")
                    return
                except Exception:  # noqa: BLE001 - admin port not yet up
                    pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"fluxond exited: {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError("fluxond did not start in 20 s")

    def kill9(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def ctl(self, *args):
        out = subprocess.run([self.fluxonctl, "--admin", self.admin, "--json", *args],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return json.loads(out)

    def keys(self) -> int:
        return int(self.ctl("status")["keys"])

    def stats(self) -> dict:
        return self.ctl("stats")

    def wait_keys(self, want: int, timeout_s: float = 30.0) -> int:
        """Waits (bounded) until the owner holds `want` keys and the count stays for 1 s."""
        deadline = time.time() + timeout_s
        last, since = -1, time.time()
        while time.time() < deadline:
            n = self.keys()
            if n != last:
                last, since = n, time.time()
            elif n >= want and time.time() - since >= 1.0:
                return n
            time.sleep(0.1)
        return last


class Server:
    """One launched SGLang server."""

    def __init__(self, tmp, name, model_dir, extra):
        self.name = name
        self.port = free_port()
        self.log_path = os.path.join(tmp, f"server-{name}.log")
        env = dict(os.environ, **SERVER_ENV)
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir,
               "--host", "127.0.0.1", "--port", str(self.port), *SERVER_FLAGS, *extra]
        with open(self.log_path, "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.ready_s = None
        self.t0 = time.time()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def poll_ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                               f"{self.tail(8)}")
        try:
            with urllib.request.urlopen(self.url("/health_generate"), timeout=5) as r:
                if r.status == 200:
                    self.ready_s = time.time() - self.t0
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        return False

    def post(self, path, body=None, timeout=120):
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.url(path), data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def generate(self, ids):
        """(output token ids, meta_info, seconds) of a greedy request."""
        t0 = time.time()
        out = self.post("/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}})
        return out["output_ids"], out["meta_info"], time.time() - t0

    def flush(self):
        deadline = time.time() + 30
        while True:
            try:
                self.post("/flush_cache", timeout=30)
                return
            except urllib.error.HTTPError as e:  # 400 while requests are in flight
                if time.time() > deadline:
                    raise RuntimeError(f"{self.name}: /flush_cache refused for 30 s") from e
                time.sleep(0.2)

    def tail(self, n):
        with open(self.log_path, errors="replace") as f:
            return " | ".join(f.read().splitlines()[-n:])

    def tracebacks(self) -> int:
        with open(self.log_path, errors="replace") as f:
            return sum("Traceback" in line for line in f)

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, 9)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)


def cached(meta) -> tuple[int, dict]:
    return int(meta.get("cached_tokens", 0)), meta.get("cached_tokens_details") or {}


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="fluxon-serve-")
    model_dir = os.path.join(tmp, "model")
    os.makedirs(model_dir)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(MODEL_CONFIG, f)
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
            servers[name] = Server(tmp, name, model_dir, extra)

        def ready():
            deadline = time.time() + READY_TIMEOUT_S
            waiting = set(servers)
            while waiting and time.time() < deadline:
                waiting = {n for n in waiting if not servers[n].poll_ready()}
                time.sleep(1.0)
            if waiting:
                raise RuntimeError(f"not ready in {READY_TIMEOUT_S} s: {sorted(waiting)}: "
                                   + servers[sorted(waiting)[0]].tail(6))
            return ", ".join(f"{n} {s.ready_s:.0f}s" for n, s in servers.items())

        checks("4 servers launched and healthy", ready)
        if any(r[1] != "PASS" for r in checks.results):
            return checks.report("launched SGLang servers with fluxon")

        def reference():
            state["ref"] = [servers["plain"].generate(p)[0] for p in prompts]
            state["ref_extra"] = [servers["plain"].generate(p)[0] for p in extra_prompts]
            return f"{len(prompts) + len(extra_prompts)} greedy outputs of {NEW_TOKENS} tokens"

        checks("reference outputs (no cache)", reference)

        def round_trip(server_name, owner, source_key):
            """Cold, device hit, flush, restore: the restore comes from the store."""
            s = servers[server_name]
            cold, dev, rest = [], [], []
            for p in prompts:
                cold.append(s.generate(p))
            for p in prompts:
                dev.append(s.generate(p))
            keys = owner.wait_keys(PAGES_PER_PROMPT * PROMPTS)
            s.flush()
            for p in prompts:
                rest.append(s.generate(p))
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
                out, meta, _ = s.generate(p)
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
                out, meta, _ = s.generate(prompts[i])
                if cached(meta)[0] != 0:
                    raise AssertionError(f"hit {cached(meta)} with the owner down")
                if out != state["ref"][i]:
                    raise AssertionError("output differs with the owner down")
            owner_b.start()
            # Hits resume: a new prompt is offloaded to the new owner and restored after a
            # flush (the first offload after the restart may find the old connection broken).
            for attempt in range(4):
                p = extra_prompts[attempt]
                s.generate(p)
                owner_b.wait_keys(PAGES_PER_PROMPT, timeout_s=5)
                s.flush()
                out, meta, _ = s.generate(p)
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
        keep = os.environ.get("SERVE_KEEP")
        if keep:
            os.makedirs(keep, exist_ok=True)
            for root, _, files in os.walk(tmp):
                for f in files:
                    if f.endswith(".log"):
                        rel = os.path.relpath(os.path.join(root, f), tmp).replace("/", "_")
                        shutil.copy(os.path.join(root, f), os.path.join(keep, rel))
        shutil.rmtree(tmp, ignore_errors=True)
    return checks.report("launched SGLang servers with fluxon")


if __name__ == "__main__":
    sys.exit(main())
