"""Fixtures: a real fluxond process per test (module) on a private socket."""

import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLUXOND = os.environ.get("FLUXOND", str(ROOT / "build" / "src" / "fluxond"))
# The line fluxond prints once every listener accepts (a log line that merely contains "ready",
# such as an error saying something exists "already", is not it).
READY_LINE = re.compile(r"^fluxond \S+ ready$", re.MULTILINE)


def _ephemeral_port_range():
    """The kernel's range for ports it picks itself (connect(), bind to port 0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_PORTS_HANDED_OUT = set()


def port_is_free(port: int) -> bool:
    """Nothing listens on `port` (a connection lingering in TIME_WAIT does not count: fluxond and
    etcd bind with SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port() -> int:
    """A port on 127.0.0.1 for a daemon to listen on, chosen below the kernel's ephemeral range.

    A port the kernel picked (a bind to port 0) is free only until the next outgoing connection:
    between this check and the daemon's bind, any client connection (an owner reconnecting to a
    restarted master, say) may take it as its local port, and the daemon then fails with "address
    in use". Ports below the ephemeral range are never handed out that way. Each port is handed out
    once per test process; the choice is random so that concurrent test processes rarely meet."""
    low, _ = _ephemeral_port_range()
    first = max(1024, low - 20000)
    if low - first >= 1000:
        choose = random.SystemRandom()
        for _ in range(500):
            port = choose.randrange(first, low)
            if port not in _PORTS_HANDED_OUT and port_is_free(port):
                _PORTS_HANDED_OUT.add(port)
                return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def terminate(proc, timeout=10):
    """SIGTERM, then SIGKILL after `timeout` s; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Daemon:
    """A fluxond child process; stops it on close."""

    def __init__(self, config_text: str, tmp: Path, name: str = "fluxond", env=None):
        self.config = tmp / f"{name}.yaml"
        self.config.write_text(config_text)
        self.log = tmp / f"{name}.log"
        self.proc = subprocess.Popen([FLUXOND, "--config", str(self.config)],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     env=None if env is None else {**os.environ, **env})
        deadline = time.time() + 20
        while time.time() < deadline:
            if READY_LINE.search(self.log.read_text()):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"fluxond exited: {self.log.read_text()}")
            time.sleep(0.02)
        raise RuntimeError(f"fluxond did not start: {self.log.read_text()}")

    def stop(self):
        return terminate(self.proc)

    def log_tail(self, lines=40, width=400):
        """The last `lines` lines of its log (each cut to `width` characters), with its state."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError as e:
            text = [f"(log unreadable: {e})"]
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        body = "\n".join(line[:width] for line in text[-lines:])
        return f"--- {self.log.name} (pid {self.proc.pid}, {state}) ---\n{body}"


def embedded_config(sock: str, extra_owner: str = "", extra: str = "", size: str = "1GiB",
                    log_level: str = "warn") -> str:
    return f"""
role: embedded
log_level: {log_level}
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {sock}
  segment: {{size: {size}}}
  local_reserve: {{claim_soft_timeout_ms: 5, claim_hard_timeout_ms: 1000}}
  eviction_interval_ms: 10
{extra_owner}
{extra}
"""


def owner_config(node: int, admin_port: int, master_address, sock: str,
                 remote_get_timeout_ms: int, extra: str = "") -> str:
    """A cluster owner: mutations allowed on its admin port, a 1 GiB segment, a heartbeat every
    200 ms and a data plane on 127.0.0.1; `extra` follows the owner section (more of its keys,
    indented, or top-level sections). master_address None: no owner.master_address (the owner
    follows an election given in `extra`)."""
    master_line = "" if master_address is None else f'master_address: "{master_address}"'
    return f"""
role: owner
node_id: {node}
log_level: info
admin: {{listen_address: "127.0.0.1:{admin_port}", metrics_port: 0, allow_mutations: true}}
owner:
  {master_line}
  socket_path: {sock}
  segment: {{size: 1GiB}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  remote_get_timeout_ms: {remote_get_timeout_ms}
{extra}
"""


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report carries the tail of every fluxond log it started."""
    outcome = yield
    report = outcome.get_result()
    daemons = getattr(item, "fluxond_daemons", None)
    if report.failed and daemons:
        report.sections.append((f"fluxond logs ({report.when})",
                                "\n".join(d.log_tail() for d in daemons)))


@pytest.fixture
def daemon_factory(tmp_path, request):
    started = []
    request.node.fluxond_daemons = started

    def start(config_text: str, name: str = "fluxond", env=None) -> Daemon:
        d = Daemon(config_text, tmp_path, name, env)
        started.append(d)
        return d

    yield start
    for d in reversed(started):
        d.stop()


@pytest.fixture
def sock(tmp_path):
    # Unix socket paths are short: keep them out of pytest's long tmp dirs.
    d = Path(tempfile.mkdtemp(prefix="fx", dir="/tmp"))
    yield str(d / "owner.sock")


@pytest.fixture
def daemon(daemon_factory, sock):
    return daemon_factory(embedded_config(sock))


@pytest.fixture
def client(daemon, sock):
    import fluxon
    return fluxon.KvClient(socket_path=sock)
