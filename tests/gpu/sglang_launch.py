"""Launching real SGLang servers and fluxond owners for the GPU tests and benchmarks.

Harness only (tests/gpu/test_serve_real.py, bench/gpu/serving_bench.py); SGLang's sources and
the test stand-ins (tests/gpu/standins) must be on PYTHONPATH, FLUXOND names the fluxond of the
wheel under test (fluxonctl beside it).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

# Flags every launched server takes: dummy weights, token ids in and out, the backends the
# stand-ins support, no CUDA graphs (their capture dominates start-up for a short test).
BASE_FLAGS = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--attention-backend", "triton",
    "--sampling-backend", "pytorch", "--grammar-backend", "none",
    "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
    "--random-seed", "0",
]

SERVER_ENV = {
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",  # the wheel's Rust core needs torch 2.14
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def llama_config(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab):
    """A LlamaForCausalLM config.json (bf16) for `--load-format dummy`."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": vocab, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2,
    }


def write_model(directory, config):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Owner:
    """One embedded fluxond on its own socket and admin port; kill -9 and restart in place."""

    def __init__(self, tmp, name, segment="2GiB"):
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
  segment: {{size: {segment}}}
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
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.exists(self.socket):
                try:
                    self.ctl("status")
                    return self
                except Exception:  # noqa: BLE001 - admin port not yet up
                    pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"fluxond exited: {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError("fluxond did not start in 60 s")

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
    """One launched SGLang server (`python -m sglang.launch_server`), its own process group."""

    def __init__(self, tmp, name, model_dir, flags, env=None):
        self.name = name
        self.port = free_port()
        self.log_path = os.path.join(tmp, f"server-{name}.log")
        full_env = dict(os.environ, **SERVER_ENV, **(env or {}))
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir,
               "--host", "127.0.0.1", "--port", str(self.port), *BASE_FLAGS, *flags]
        with open(self.log_path, "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
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

    def generate(self, ids, max_new_tokens, timeout=120):
        """(output token ids, meta_info, seconds) of a greedy request."""
        t0 = time.time()
        out = self.post("/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}},
            timeout=timeout)
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


def wait_ready(servers, timeout_s):
    """Waits (bounded) for every server's /health_generate; raises naming the laggards."""
    deadline = time.time() + timeout_s
    waiting = set(servers)
    while waiting and time.time() < deadline:
        waiting = {n for n in waiting if not servers[n].poll_ready()}
        if waiting:
            time.sleep(1.0)
    if waiting:
        first = sorted(waiting)[0]
        raise RuntimeError(f"not ready in {timeout_s} s: {sorted(waiting)}: "
                           + servers[first].tail(6))
    return ", ".join(f"{n} {s.ready_s:.0f}s" for n, s in servers.items())


def keep_logs(tmp, prefix=""):
    """Copies every *.log under `tmp` to $SERVE_KEEP (when set) before `tmp` is removed."""
    keep = os.environ.get("SERVE_KEEP")
    if not keep:
        return
    os.makedirs(keep, exist_ok=True)
    for root, _, files in os.walk(tmp):
        for f in files:
            if f.endswith(".log"):
                rel = os.path.relpath(os.path.join(root, f), tmp).replace("/", "_")
                shutil.copy(os.path.join(root, f), os.path.join(keep, prefix + rel))
