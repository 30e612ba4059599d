#!/usr/bin/env python3
"""Master election failover through a real etcd: how long a standby takes to lead after the
leader stops cleanly (SIGTERM: its lease is revoked), is killed (-9: its lease runs out) or is
paused past its lease (SIGSTOP), and how soon a paused leader, resumed, stops leading.

Each round starts two candidates (`election_candidate`, each its own process, writing what it
believes every 20 ms) against one etcd on loopback, waits for a leader, applies the fault and
times until the other candidate reports that it leads (its state file), polled every 5 ms.

    python3 bench/election_failover.py [--rounds 5] [--ttl 2] [--candidate PATH] [--etcd PATH]
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time

KEY = "/fluxon/bench/master/leader"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_state(path):
    try:
        with open(path) as f:
            fields = dict(kv.split("=", 1) for kv in f.read().split())
        return int(fields["seq"]), fields["leader_now"] == "1"
    except (OSError, KeyError, ValueError):
        return 0, False


def wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(0.005)
    raise TimeoutError(what)


def start_etcd(etcd, tmp):
    cport, pport = free_port(), free_port()
    log = os.path.join(tmp, "etcd.log")
    proc = subprocess.Popen(
        [etcd, "--name", "e0", "--data-dir", os.path.join(tmp, "etcd-data"),
         "--listen-client-urls", f"http://127.0.0.1:{cport}",
         "--advertise-client-urls", f"http://127.0.0.1:{cport}",
         "--listen-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-cluster", f"e0=http://127.0.0.1:{pport}"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait(lambda: "ready to serve client requests" in open(log).read(), 30, "etcd ready")
    return proc, f"127.0.0.1:{cport}"


def one_round(a, endpoint, tmp, fault, r):
    names = [f"r{r}a", f"r{r}b"]
    procs = {}
    for n in names:
        procs[n] = subprocess.Popen(
            [a.candidate, endpoint, KEY, n, str(a.ttl), os.path.join(tmp, n + ".state")],
            stdout=open(os.path.join(tmp, n + ".log"), "w"), stderr=subprocess.STDOUT)
        time.sleep(0.05)  # the first one started leads
    state = {n: os.path.join(tmp, n + ".state") for n in names}
    try:
        wait(lambda: any(read_state(state[n])[1] for n in names), 15, "a leader")
        leader = next(n for n in names if read_state(state[n])[1])
        other = next(n for n in names if n != leader)
        out = {}
        t0 = time.monotonic()
        if fault == "stop":
            procs[leader].send_signal(signal.SIGTERM)
        elif fault == "kill":
            procs[leader].kill()
        else:
            procs[leader].send_signal(signal.SIGSTOP)
        t1 = wait(lambda: read_state(state[other])[1], a.ttl + 10, "takeover")
        out["takeover_ms"] = (t1 - t0) * 1e3
        if fault == "pause":
            seq = read_state(state[leader])[0]
            t2 = time.monotonic()
            procs[leader].send_signal(signal.SIGCONT)
            t3 = wait(lambda: read_state(state[leader])[0] > seq, 5, "resumed report")
            out["resumed_leading"] = read_state(state[leader])[1]
            out["resume_report_ms"] = (t3 - t2) * 1e3
        return out
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ttl", type=int, default=2, help="the candidates' lease TTL in seconds")
    ap.add_argument("--candidate", default="build/tests/election_candidate")
    ap.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fluxon-election-bench-")
    etcd, endpoint = start_etcd(a.etcd, tmp)
    rows = {}
    try:
        for r in range(a.rounds):  # the faults alternate inside every round
            for fault in ("stop", "kill", "pause"):
                rows.setdefault(fault, []).append(one_round(a, endpoint, tmp, fault, r))
    finally:
        etcd.terminate()
        etcd.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n## Election failover (etcd on loopback, TTL {a.ttl} s, {a.rounds} rounds)\n")
    print("| fault | takeover p50 ms | min | max | notes |\n|---|---|---|---|---|")
    for fault, label in (("stop", "SIGTERM (lease revoked)"), ("kill", "kill -9"),
                         ("pause", "SIGSTOP past the lease")):
        t = [x["takeover_ms"] for x in rows[fault]]
        note = ""
        if fault == "pause":
            leading = sum(x["resumed_leading"] for x in rows[fault])
            rep = statistics.median(x["resume_report_ms"] for x in rows[fault])
            note = (f"resumed leader still leading in {leading} of {len(t)}; its first report "
                    f"after SIGCONT in {rep:.0f} ms (p50)")
        print(f"| {label} | {statistics.median(t):.0f} | {min(t):.0f} | {max(t):.0f} | {note} |")


if __name__ == "__main__":
    main()
