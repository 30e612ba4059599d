"""A real etcd (Debian's etcd-server) on loopback for the high-availability tests and the
failover benchmark: one member or a cluster of several, each a child process with its own data
directory, started, killed and restarted by the caller. Every wait is bounded."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from conftest import free_port, terminate


def etcd_binary():
    for p in (os.environ.get("ETCD"), shutil.which("etcd"), "/usr/bin/etcd", "/usr/local/bin/etcd"):
        if p and os.access(p, os.X_OK):
            return p
    return None


READY = "ready to serve client requests"


class EtcdMember:
    def __init__(self, name, tmp: Path, client_port, peer_port, initial_cluster, tls=None):
        self.name, self.tmp, self.tls = name, tmp, tls
        self.client_port, self.peer_port = client_port, peer_port
        self.initial_cluster = initial_cluster
        self.data_dir = tmp / f"etcd-{name}"
        self.log = tmp / f"etcd-{name}.log"
        self.proc = None
        self.starts = 0

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.client_port}"

    def start(self):
        # tls: (cert, key, ca) — clients connect over TLS and must present a certificate of ca.
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
        tls_args = [] if not self.tls else [
            "--cert-file", str(self.tls[0]), "--key-file", str(self.tls[1]),
            "--client-cert-auth", "--trusted-ca-file", str(self.tls[2])]
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.starts += 1
        # A fresh log per start: readiness is judged on this start's lines only.
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(
            [etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
             "--initial-cluster-token", "fluxon-test", *tls_args],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT)

    def ready(self):
        with open(self.log, "rb") as f:
            f.seek(self.log_offset)
            return READY in f.read().decode(errors="replace")

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def stop(self):
        if self.proc:
            terminate(self.proc)


class Etcd:
    """`members` etcd members on loopback forming one cluster; `tls`: (cert, key, ca) of every
    member's client port (clients must present a certificate of that CA)."""

    def __init__(self, tmp: Path, members=1, tls=None):
        ports = [(free_port(), free_port()) for _ in range(members)]
        initial = ",".join(f"e{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        self.members = [EtcdMember(f"e{i}", tmp, c, p, initial, tls)
                        for i, (c, p) in enumerate(ports)]
        for m in self.members:
            m.start()
        self.wait_ready(self.members)

    @property
    def endpoints(self):
        return [m.endpoint for m in self.members]

    def wait_ready(self, members, timeout=30):
        deadline = time.time() + timeout
        while not all(m.ready() for m in members):
            for m in members:
                if m.proc.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited: {m.log.read_text()[-3000:]}")
            if time.time() > deadline:
                raise RuntimeError("etcd did not become ready: " +
                                   " | ".join(m.log.read_text()[-1500:] for m in members))
            time.sleep(0.05)

    def restart(self, members=None):
        members = members or self.members
        for m in members:
            m.start()
        self.wait_ready(members)

    def stop(self):
        for m in self.members:
            m.stop()
