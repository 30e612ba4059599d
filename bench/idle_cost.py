#!/usr/bin/env python3
"""An owner's idle CPU against what it holds.

Starts an embedded fluxond (its own config, segment sized for the values), measures the process's
CPU while idle, puts N values of VALUE_LEN bytes in batches through the hostless API, then
measures idle CPU again in consecutive windows (no traffic). Prints one table row per window.

  PYTHONPATH=build/python python3 bench/idle_cost.py --values 1048576 --value-len 4096
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))
import fluxon  # noqa: E402


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_pct(pid, seconds):
    a = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - a) / seconds * 100


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--values", type=int, default=1 << 20)
    ap.add_argument("--value-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window-s", type=float, default=3.0)
    ap.add_argument("--shrink-idle-ms", type=int, default=5000)
    ap.add_argument("--fluxond", default=os.environ.get("FLUXOND",
                                                        str(ROOT / "build/src/fluxond")))
    a = ap.parse_args()
    slot = max(4096, -(-a.value_len // 4096) * 4096)
    segment_gib = -(-(a.values * slot * 5 // 4) // (1 << 30)) + 1
    d = Path(tempfile.mkdtemp(prefix="fxidle", dir="/tmp"))
    sock = d / "owner.sock"
    (d / "c.yaml").write_text(f"""
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {sock}
  segment: {{size: {segment_gib}GiB}}
  local_reserve: {{shrink_idle_ms: {a.shrink_idle_ms}}}
""")
    p = subprocess.Popen([a.fluxond, "--config", str(d / "c.yaml")],
                         stdout=open(d / "log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 20
        while not sock.exists():
            if time.time() > deadline or p.poll() is not None:
                raise SystemExit((d / "log").read_text())
            time.sleep(0.05)
        time.sleep(0.5)
        before = idle_pct(p.pid, a.window_s)
        c = fluxon.KvClient(socket_path=str(sock))
        buf = np.full(a.batch * a.value_len, 7, dtype=np.uint8)
        t0 = time.time()
        for b in range(a.values // a.batch):
            plan = c.local_fast_put_start([f"i{b}-{i}" for i in range(a.batch)], a.value_len)
            fluxon.copy_to_plan(plan, buf.ctypes.data, a.value_len)
            c.local_fast_put_commit(plan).wait(60)
        put_s = time.time() - t0
        time.sleep(3.0)
        print(f"{a.values} values x {a.value_len} B, segment {segment_gib} GiB, "
              f"shrink_idle {a.shrink_idle_ms} ms; put in {put_s:.1f} s; "
              f"keys resident {c.stats()['keys']}\n")
        print("| window | idle CPU (% of a core) |\n|---|---|")
        print(f"| before the first put | {before:.2f} |")
        for w in range(a.windows):
            print(f"| {3 + w * a.window_s:.0f}-{3 + (w + 1) * a.window_s:.0f} s after | "
                  f"{idle_pct(p.pid, a.window_s):.2f} |")
        print(f"\ngrants shrunk: {c.stats().get('grants_shrunk')}, "
              f"grants: {c.stats().get('grants')}")
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
