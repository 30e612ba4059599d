"""Shared set-up of the GPU tests that run against a real fluxond: the daemon and the result table.

Every check runs, a failure is recorded (with its traceback printed) and the next check goes on;
the table at the end is what gpu-run.sh prints.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import traceback


def start_daemon(tmp):
    """An embedded fluxond with a 4 GiB segment in `tmp`; returns (process, owner socket)."""
    sock = os.path.join(tmp, "owner.sock")
    cfg = os.path.join(tmp, "fluxond.yaml")
    with open(cfg, "w") as f:
        f.write(f"""
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {sock}
  segment: {{size: 4GiB}}
""")
    log = open(os.path.join(tmp, "fluxond.log"), "w")
    proc = subprocess.Popen([os.environ.get("FLUXOND", "fluxond"), "--config", cfg], stdout=log,
                            stderr=subprocess.STDOUT)
    for _ in range(400):
        if os.path.exists(sock):
            return proc, sock
        if proc.poll() is not None:
            raise RuntimeError(open(os.path.join(tmp, "fluxond.log")).read())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("fluxond did not start")


def stop_daemon(proc, tmp):
    proc.terminate()
    proc.wait(timeout=20)
    shutil.rmtree(tmp, ignore_errors=True)


class Checks:
    """Named checks and their results: (name, PASS | FAIL | n/a, note, seconds)."""

    def __init__(self, not_applicable=()):
        # Exception types that mean "this case does not exist here", recorded as n/a.
        self._not_applicable = tuple(not_applicable)
        self.results = []

    def __call__(self, name, fn):
        t0 = time.time()
        try:
            note = fn()  # a check may return a note for the table
            note = note if isinstance(note, str) else ""
            self.results.append((name, "PASS", note, time.time() - t0))
        except self._not_applicable as e:
            self.results.append((name, "n/a", f"not built here: {str(e)[:50]}", 0.0))
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            traceback.print_exc()
            self.results.append((name, "FAIL", f"{type(e).__name__}: {e}"[:90], time.time() - t0))

    def report(self, title) -> int:
        """Prints the table; 0 when nothing failed and something passed."""
        print(f"\n## {title}\n")
        print("| case | result | note | s |\n|---|---|---|---|")
        for name, res, note, secs in self.results:
            print(f"| {name} | {res} | {note} | {secs:.2f} |")
        passed = sum(r[1] == "PASS" for r in self.results)
        failed = sum(r[1] == "FAIL" for r in self.results)
        print(f"\n{passed} passed, {failed} failed")
        return 0 if failed == 0 and passed > 0 else 1
