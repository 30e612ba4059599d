"""fluxond and the systemd notify protocol (src/daemon/systemd_notify.h).

The test plays the service manager: it binds the AF_UNIX datagram socket that NOTIFY_SOCKET names
and records every message fluxond sends (READY=1, STATUS=..., WATCHDOG=1, STOPPING=1) with the
time it arrived. WATCHDOG_PID is left unset: sd_watchdog_enabled then applies WATCHDOG_USEC to
whichever process reads it (the child's pid is not known before it starts). Every wait is
bounded.
"""

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import FLUXOND, embedded_config

WATCHDOG_USEC = 400_000  # fluxond pings every 200 ms
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0


class NotifyListener:
    """The manager's end of NOTIFY_SOCKET: a reader thread timestamps each datagram."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.05)
        self.messages = []  # (monotonic time, {field: value}) in arrival order
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.closed:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            with self.cond:
                self.messages.append((time.monotonic(), fields))
                self.cond.notify_all()

    def wait_for(self, field: str, value: str = None, timeout: float = 5.0, after: float = 0.0):
        """The first message at or after `after` carrying field (=value); None on timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for t, m in self.messages:
                    if t >= after and field in m and (value is None or m[field] == value):
                        return t, m
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def times(self, field: str, value: str, start: float = 0.0, end: float = float("inf")):
        with self.cond:
            return [t for t, m in self.messages if start <= t <= end and m.get(field) == value]

    def close(self):
        self.closed = True
        self.thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def rundir():
    # Unix socket paths are short: keep them out of pytest's long tmp dirs.
    d = Path(tempfile.mkdtemp(prefix="fxsd", dir="/tmp"))
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


@pytest.fixture
def listener(rundir):
    n = NotifyListener(str(rundir / "notify.sock"))
    yield n
    n.close()


@pytest.fixture
def spawn(tmp_path):
    """Starts fluxond with the given extra environment; kills what is left at the end."""
    procs = []

    def start(config_text: str, env_extra: dict, drop=("NOTIFY_SOCKET", "WATCHDOG_USEC",
                                                      "WATCHDOG_PID")):
        cfg = tmp_path / f"fluxond{len(procs)}.yaml"
        cfg.write_text(config_text)
        log = tmp_path / f"fluxond{len(procs)}.log"
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(env_extra)
        p = subprocess.Popen([FLUXOND, "--config", str(cfg)], env=env,
                             stdout=open(log, "w"), stderr=subprocess.STDOUT)
        p.log = log
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=STOP_TIMEOUT)


def can_connect(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(2)
        try:
            c.connect(path)
            return True
        except OSError:
            return False


def wait_ready(listener, proc, timeout=START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = listener.wait_for("READY", "1", timeout=0.2)
        if got is not None:
            return got
        assert proc.poll() is None, f"fluxond exited: {proc.log.read_text()}"
    pytest.fail(f"no READY=1 within {timeout}s: {proc.log.read_text()}")


def stop_and_wait(proc, timeout=STOP_TIMEOUT) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fluxond did not exit within {timeout}s of SIGTERM: {proc.log.read_text()}")


def test_ready_watchdog_stopping(rundir, listener, spawn):
    client_sock = str(rundir / "owner.sock")
    t0 = time.monotonic()
    proc = spawn(embedded_config(client_sock),
                 {"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)})

    t_ready, ready = wait_ready(listener, proc)
    # READY=1 comes only once the node is started: the client socket accepts at once.
    assert can_connect(client_sock), "READY=1 arrived before the client socket accepted"
    assert "role=embedded" in ready.get("STATUS", ""), ready
    assert "node_id=" in ready["STATUS"], ready
    assert t_ready - t0 < START_TIMEOUT
    assert len(listener.times("READY", "1")) == 1

    # WATCHDOG=1 every WATCHDOG_USEC/2 (200 ms): at least 3 within 1.5 s.
    time.sleep(1.5)
    pings = listener.times("WATCHDOG", "1", start=t_ready, end=t_ready + 1.5)
    assert len(pings) >= 3, f"{len(pings)} pings in 1.5 s: {listener.messages}"
    gaps = sorted(b - a for a, b in zip(pings, pings[1:]))
    # Every half interval (200 ms): never faster than a quarter of it; typically on time (the
    # median; a single late ping on a loaded machine is not what this checks).
    assert gaps[0] >= WATCHDOG_USEC / 4e6, gaps
    assert 0.15 <= gaps[len(gaps) // 2] <= 0.3, gaps

    t_term = time.monotonic()
    rc = stop_and_wait(proc)
    assert rc == 0, proc.log.read_text()
    got = listener.wait_for("STOPPING", "1", timeout=2.0, after=t_term)
    assert got is not None, f"no STOPPING=1 after SIGTERM: {listener.messages}"
    t_stopping, stopping = got
    assert "signal 15" in stopping.get("STATUS", ""), stopping
    # No ping once shutdown began.
    assert listener.times("WATCHDOG", "1", start=t_stopping) == []


def test_watchdog_withheld_while_unhealthy(rundir, listener, spawn):
    # The health probe checks the client socket is in place: without it no client can attach,
    # so fluxond stops pinging and systemd (WatchdogSec=) restarts it.
    client_sock = str(rundir / "owner.sock")
    proc = spawn(embedded_config(client_sock),
                 {"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)})
    t_ready, _ = wait_ready(listener, proc)
    assert listener.wait_for("WATCHDOG", "1", timeout=2.0, after=t_ready) is not None

    os.unlink(client_sock)
    t_gone = time.monotonic()
    got = listener.wait_for("STATUS", timeout=2.0, after=t_gone)
    deadline = time.monotonic() + 2.0
    while got is not None and not got[1]["STATUS"].startswith("unhealthy"):
        got = listener.wait_for("STATUS", timeout=max(0.0, deadline - time.monotonic()),
                                after=got[0] + 1e-9)
    assert got is not None, f"no unhealthy STATUS: {listener.messages}"
    assert "client socket" in got[1]["STATUS"], got
    t_unhealthy = got[0]
    time.sleep(1.0)
    # At most one ping raced the unlink (its probe ran before it); none after the STATUS.
    assert listener.times("WATCHDOG", "1", start=t_unhealthy) == []
    assert len(listener.times("WATCHDOG", "1", start=t_gone)) <= 1

    assert stop_and_wait(proc) == 0, proc.log.read_text()


def test_watchdog_pid_of_another_process_means_no_watchdog(rundir, listener, spawn):
    # sd_watchdog_enabled: WATCHDOG_PID naming another process means the watchdog is not ours.
    client_sock = str(rundir / "owner.sock")
    proc = spawn(embedded_config(client_sock),
                 {"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": str(WATCHDOG_USEC),
                  "WATCHDOG_PID": "1"})
    t_ready, _ = wait_ready(listener, proc)
    time.sleep(0.8)
    assert listener.times("WATCHDOG", "1") == []
    t_term = time.monotonic()
    assert stop_and_wait(proc) == 0, proc.log.read_text()
    assert listener.wait_for("STOPPING", "1", timeout=2.0, after=t_term) is not None


def test_without_notify_socket_starts_normally(rundir, spawn):
    client_sock = str(rundir / "owner.sock")
    # WATCHDOG_USEC alone (no NOTIFY_SOCKET) must not start anything either.
    proc = spawn(embedded_config(client_sock), {"WATCHDOG_USEC": str(WATCHDOG_USEC)})
    deadline = time.monotonic() + START_TIMEOUT
    while "ready" not in proc.log.read_text():
        assert proc.poll() is None, f"fluxond exited: {proc.log.read_text()}"
        assert time.monotonic() < deadline, f"fluxond did not start: {proc.log.read_text()}"
        time.sleep(0.02)
    assert can_connect(client_sock)
    time.sleep(0.5)
    assert proc.poll() is None
    assert stop_and_wait(proc) == 0, proc.log.read_text()
    log = proc.log.read_text()
    assert "sd_notify" not in log and "watchdog" not in log, log


def test_failed_start_reports_status_and_no_ready(rundir, listener, spawn):
    # A node that cannot start says why in STATUS= and never sends READY=1.
    proc = spawn(embedded_config(str(rundir / "owner.sock"),
                                 extra_owner="  socket_group: fluxon-no-such-group"),
                 {"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)})
    try:
        rc = proc.wait(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fluxond did not exit: {proc.log.read_text()}")
    assert rc == 1, proc.log.read_text()
    got = listener.wait_for("STATUS", timeout=2.0)
    assert got is not None, f"no STATUS: {listener.messages}"
    assert got[1]["STATUS"].startswith("failed to start:"), got
    assert "fluxon-no-such-group" in got[1]["STATUS"], got
    assert listener.times("READY", "1") == []
