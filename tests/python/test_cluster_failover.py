"""Standby masters elected through a real etcd, with real fluxond processes on loopback: two
masters campaign for one key, two owners follow whichever leads (`election:` instead of
owner.master_address). After each fault — the leader killed (-9), the leader paused past its
lease and resumed, etcd killed and restarted — every put acknowledged before the fault is found
again from the other owner (bytes compared), puts committed during the outage complete once a
leader serves, the old leader serves nothing, and every process's temporary state is back at
baseline. docs/ha.md has the rules these check."""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

import fluxon
from conftest import free_port, owner_config, port_is_free
from etcd_proc import Etcd, etcd_binary
from test_cluster_remote_get import (FLUXONCTL, Cluster, expect_pages, get_pages, keys_of,  # noqa: F401
                                     put_pages, wait_baseline)

pytestmark = pytest.mark.skipif(etcd_binary() is None,
                                reason="no etcd binary (scripts/install-deps.sh installs it)")

TTL_S = 2  # the masters' lease: the shortest etcd grants


class HaCluster(Cluster):
    """etcd, `masters` master candidates and owners 1..n, each its own process and config."""

    def __init__(self, factory, tmp, masters=2, owners=2, etcd_members=1, security="",
                 etcd_tls=None):
        self.factory, self.tmp, self.security = factory, tmp, security
        self.etcd = Etcd(tmp, etcd_members, etcd_tls)
        self.key = f"/fluxon/test-{uuid.uuid4().hex[:8]}/master/leader"
        self.sockdir = Path(tempfile.mkdtemp(prefix="fxh", dir="/tmp"))
        self.remote_timeout_ms, self.owner_extra = 5000, ""
        self.masters = {}       # index -> Daemon
        self.master_admins = {}  # index -> admin port
        self.master_ports = {}   # index -> master service port
        self.master_configs = {}
        for i in range(masters):
            self.start_master(i)
        self.master_admin = self.master_admins[self.wait_leader()]
        self.admin, self.daemons = {}, {}
        for node in range(1, owners + 1):
            self.start_owner(node)

    def election(self, extra=""):
        endpoints = ", ".join(f'"{e}"' for e in self.etcd.endpoints)
        return (f'election: {{endpoints: [{endpoints}], key: "{self.key}", lease_ttl_s: {TTL_S}, '
                f'poll_interval_ms: 100{extra}}}\n')

    def start_master(self, i):
        if i not in self.master_configs:
            self.master_admins[i] = free_port()
            self.master_ports[i] = free_port()
            self.master_configs[i] = f"""
role: master
log_level: info
master: {{listen_address: "127.0.0.1:{self.master_ports[i]}", owner_lease_ms: 1500, owner_grace_ms: 1000,
          inflight_ttl_ms: 60000}}
admin: {{listen_address: "127.0.0.1:{self.master_admins[i]}", metrics_port: 0}}
{self.election()}{self.security}"""
        self.masters[i] = self.factory(self.master_configs[i], name=f"master{i}-{time.time_ns()}")
        return self.masters[i]

    def start_owner(self, node, name=None, env=None):
        self.admin[node] = free_port()
        d = self.factory(owner_config(node, self.admin[node], None, self.sock(node),
                                      self.remote_timeout_ms, f"""\
  local_reserve: {{claim_soft_timeout_ms: 5, claim_hard_timeout_ms: 1000}}
  transports: [tcp]
  eviction_interval_ms: 10
{self.election()}{self.security}"""), name=name or f"owner-{node}", env=env)
        self.daemons[node] = d
        return d

    ctl_tls = ()  # fluxonctl's certificate options when the cluster runs mutual TLS

    def ctl(self, admin_port, *args, check=True):
        r = subprocess.run([FLUXONCTL, "--admin", f"127.0.0.1:{admin_port}", *self.ctl_tls,
                            "--json", *args], capture_output=True, text=True, timeout=20)
        if check:
            assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout) if r.stdout.strip().startswith(("{", "[")) else r.stdout

    def ctl_etcd(self, *args, check=True):
        """fluxonctl sent to the leading master through etcd (--etcd instead of --admin)."""
        r = subprocess.run([FLUXONCTL, "--etcd", ",".join(self.etcd.endpoints), "--etcd-key",
                            self.key, *self.ctl_tls, "--json", *args],
                           capture_output=True, text=True, timeout=20)
        if check:
            assert r.returncode == 0, r.stdout + r.stderr
            return json.loads(r.stdout)
        return r

    def kill_leader(self):
        """kill -9 of the master that leads now; returns the new leader's index (within the
        lease TTL and a margin)."""
        old = self.wait_leader()
        self.masters[old].proc.send_signal(signal.SIGKILL)
        self.masters[old].proc.wait(timeout=10)
        return self.wait_leader(timeout=TTL_S + 10, exclude=(old,))

    def master_stats_of(self, i):
        return self.ctl(self.master_admins[i], "stats", check=False)

    def leaders(self):
        """Indices of the live masters that say they lead."""
        out = []
        for i, d in self.masters.items():
            if d.proc.poll() is not None:
                continue
            s = self.master_stats_of(i)
            if isinstance(s, dict) and s.get("master_leader") == 1:
                out.append(i)
        return out

    def wait_leader(self, timeout=15, exclude=()):
        deadline = time.time() + timeout
        while True:
            live = [i for i in self.leaders() if i not in exclude]
            assert len(live) <= 1, f"two masters lead at once: {live}"
            if live:
                self.master_admin = self.master_admins[live[0]]
                return live[0]
            assert time.time() < deadline, "no master leads"
            time.sleep(0.05)


@pytest.fixture
def ha(daemon_factory, tmp):
    c = HaCluster(daemon_factory, tmp)
    yield c
    c.etcd.stop()


def wait_all_found(client, keys, seed, timeout):
    """Until every key is restored through `client` with the bytes it was written with."""
    t0 = time.time()
    while True:
        n, data = get_pages(client, keys)
        if n == len(keys):
            expect_pages(data, n, seed)
            return
        assert time.time() - t0 < timeout, f"only {n} of {len(keys)} keys found after {timeout} s"
        time.sleep(0.1)


def test_one_leader_serves_and_owners_follow_it(ha):
    a, b = ha.client(1), ha.client(2)
    keys = keys_of("one", 16)
    put_pages(a, keys, seed=3)
    n, data = get_pages(b, keys)
    assert n == len(keys)
    expect_pages(data, n, 3)
    leader = ha.wait_leader()
    standby = 1 - leader
    s = ha.master_stats_of(standby)
    assert s["master_leader"] == 0 and s["master_routes"] == 0
    assert ha.master_stats_of(leader)["master_routes"] == len(keys)
    # The standby's own master service refuses: asking it for the owners names the leader.
    r = subprocess.run([FLUXONCTL, "--admin", f"127.0.0.1:{ha.master_admins[standby]}", "owners"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "does not lead" in r.stderr, r
    wait_baseline(ha, {1: a, 2: b})


def test_leader_killed_every_acknowledged_put_is_found_from_the_other_owner(ha):
    a, b = ha.client(1), ha.client(2)
    seen, unseen = keys_of("seen", 32), keys_of("unseen", 64)
    put_pages(a, seen, seed=5)
    put_pages(a, unseen, seed=9)
    n, data = get_pages(b, seen)  # the remote path works before the fault
    assert n == len(seen)
    expect_pages(data, n, 5)

    # A put committed while no master leads completes once the new leader serves (failover
    # times: bench/failover_bench.py).
    during = keys_of("during", 16)
    put_done = threading.Event()

    def put_during():
        put_pages(a, during, seed=17)
        put_done.set()
    t = threading.Thread(target=put_during, daemon=True)
    old = ha.wait_leader()
    ha.masters[old].proc.send_signal(signal.SIGKILL)
    ha.masters[old].proc.wait(timeout=10)
    t.start()
    ha.wait_leader(timeout=TTL_S + 10, exclude=(old,))
    wait_all_found(b, unseen, 9, timeout=30)
    t.join(timeout=30)
    assert put_done.is_set(), "the put of the outage never completed"
    wait_all_found(b, during, 17, timeout=10)
    assert ha.master_stats()["master_routes"] >= len(unseen) + len(during)
    wait_baseline(ha, {1: a, 2: b})


def test_fluxonctl_reaches_whichever_master_leads_through_etcd(ha):
    """fluxonctl --etcd finds the leader's admin address in etcd (published with the leadership
    key, on its lease): before and after a failover it reaches the master that leads, and with
    no master leading it says so."""
    a = ha.client(1)
    keys = keys_of("ctl", 8)
    put_pages(a, keys, seed=41)
    old = ha.wait_leader()
    s = ha.ctl_etcd("status")
    assert s["election"] == "leader" and s["leader_address"] == f"127.0.0.1:{ha.master_ports[old]}", s
    assert ha.ctl_etcd("stats")["master_routes"] == len(keys)
    assert {o["node_id"] for o in ha.ctl_etcd("owners")["owners"]} == {1, 2}
    new = ha.kill_leader()
    deadline = time.time() + 10
    while ha.ctl_etcd("status", check=False).returncode != 0 or \
            ha.ctl_etcd("status")["leader_address"] != f"127.0.0.1:{ha.master_ports[new]}":
        assert time.time() < deadline, ha.ctl_etcd("status", check=False)
        time.sleep(0.1)
    assert ha.ctl_etcd("status")["election"] == "leader"
    # No master leads: a clear error (exit 1), not an attempt at a stale address.
    ha.masters[new].proc.send_signal(signal.SIGKILL)
    ha.masters[new].proc.wait(timeout=10)
    deadline = time.time() + TTL_S + 10
    while True:
        r = ha.ctl_etcd("status", check=False)
        if r.returncode != 0 and "no master leads" in r.stderr:
            break
        assert time.time() < deadline, r
        time.sleep(0.1)
    assert r.returncode == 1, r
    # --etcd and --admin are exclusive; --etcd-key needs --etcd.
    for bad in (["--etcd", ha.etcd.endpoints[0], "--admin", "127.0.0.1:1", "status"],
                ["--etcd-key", ha.key, "status"]):
        r = subprocess.run([FLUXONCTL, *bad], capture_output=True, text=True, timeout=20)
        assert r.returncode == 2, r


def test_leader_paused_past_its_lease_serves_nothing_when_resumed(ha):
    a, b = ha.client(1), ha.client(2)
    keys = keys_of("paused", 32)
    put_pages(a, keys, seed=21)
    old = ha.wait_leader()
    ha.masters[old].proc.send_signal(signal.SIGSTOP)
    try:
        new = ha.wait_leader(timeout=TTL_S + 10, exclude=(old,))
        wait_all_found(b, keys, 21, timeout=30)
    finally:
        ha.masters[old].proc.send_signal(signal.SIGCONT)
    # Resumed: it knows at once that its lease is gone, and only one master leads.
    time.sleep(0.3)
    assert ha.leaders() == [new]
    s = ha.master_stats_of(old)
    assert s["master_leader"] == 0 and s["master_routes"] == 0, s
    # Puts after the resume still reach the new leader only.
    more = keys_of("after-resume", 16)
    put_pages(a, more, seed=33)
    wait_all_found(b, more, 33, timeout=10)
    assert ha.master_stats_of(old)["master_routes"] == 0
    wait_baseline(ha, {1: a, 2: b})


def test_etcd_down_degrades_to_local_hits_and_recovers_by_itself(ha):
    a, b = ha.client(1), ha.client(2)
    keys = keys_of("etcd", 32)
    put_pages(a, keys, seed=41)
    ha.wait_leader()
    for m in ha.etcd.members:
        m.kill()
    # The leader serves until its lease ends by its own clock, then nobody leads.
    deadline = time.time() + TTL_S + 5
    while ha.leaders():
        assert time.time() < deadline, "a master still leads long after etcd went"
        time.sleep(0.1)
    # Local hits go on; remote gets miss (no master to route them).
    n, data = get_pages(a, keys)
    assert n == len(keys)
    expect_pages(data, n, 41)
    assert get_pages(b, keys[:4])[0] == 0
    ha.etcd.restart()
    ha.wait_leader(timeout=30)
    wait_all_found(b, keys, 41, timeout=30)
    wait_baseline(ha, {1: a, 2: b})


def test_under_load_an_etcd_member_killed_then_the_whole_etcd_cluster_restarted(daemon_factory,
                                                                                 tmp):
    """Three etcd members; clients put on owner 1 and read on owner 2 throughout. Killing one
    member leaves the cluster serving; restarting all of them costs at most a leadership. Every
    put acknowledged before each fault is read from owner 2 with its bytes afterwards."""
    ha = HaCluster(daemon_factory, tmp, etcd_members=3)
    try:
        a, b = ha.client(1), ha.client(2)
        acked, errors, stop = [], [], threading.Event()

        def load():
            # One client per thread: a batch of 8 fresh keys at a time, read back on owner 2.
            la, lb = ha.client(1), ha.client(2)
            i = 0
            while not stop.is_set():
                keys = keys_of(f"load{i}", 8)
                try:
                    put_pages(la, keys, seed=i % 200)
                    acked.append((keys, i % 200))
                    get_pages(lb, keys)  # a hit or a miss; never wrong bytes (checked below)
                except Exception as e:  # noqa: BLE001 - a put may fail while no master leads
                    errors.append(repr(e))
                i += 1
                time.sleep(0.02)
        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            time.sleep(1.0)
            before = len(acked)
            assert before > 0, errors
            # One member killed: the election and the owners fail over to the others.
            ha.etcd.members[0].kill()
            time.sleep(TTL_S + 1.0)
            ha.wait_leader(timeout=TTL_S + 10)
            n_member = len(acked)
            ha.etcd.restart([ha.etcd.members[0]])
            # The whole etcd cluster restarted: at most one leadership lost, then one leads again.
            for m in ha.etcd.members:
                m.kill()
            time.sleep(0.5)
            ha.etcd.restart()
            ha.wait_leader(timeout=30)
            time.sleep(1.0)
        finally:
            stop.set()
            t.join(timeout=60)
        assert not t.is_alive(), "the load thread hung"
        assert len(acked) > n_member > before, (before, n_member, len(acked), errors[-3:])
        # Every acknowledged put, before and after each fault, from the other owner.
        for keys, seed in acked:
            wait_all_found(b, keys, seed, timeout=30)
        wait_baseline(ha, {1: a, 2: b})
    finally:
        ha.etcd.stop()


def test_tls_to_etcd_with_the_nodes_certificates(daemon_factory, tmp):
    """security.tls set: masters and owners reach etcd over TLS with their own certificate (etcd
    requires one of the cluster's CA), and the cluster serves and fails over as in plaintext."""
    from test_security import make_ca, make_cert
    pki = Path(tempfile.mkdtemp(prefix="fxhapki"))
    make_ca(pki, "ca")
    make_cert(pki, "node", "ca")
    make_cert(pki, "operator", "ca")
    security = (f"security: {{tls: {{cert_file: {pki}/node.pem, key_file: {pki}/node.key, "
                f"ca_file: {pki}/ca.pem}}}}\n")
    HaCluster.ctl_tls = ("--tls-cert", f"{pki}/operator.pem", "--tls-key", f"{pki}/operator.key",
                         "--tls-ca", f"{pki}/ca.pem")
    try:
        ha = HaCluster(daemon_factory, tmp, security=security,
                       etcd_tls=(pki / "node.pem", pki / "node.key", pki / "ca.pem"))
        try:
            a, b = ha.client(1), ha.client(2)
            keys = keys_of("tls", 16)
            put_pages(a, keys, seed=61)
            # fluxonctl reaches etcd with the operator's certificate, then the leader.
            assert ha.ctl_etcd("status")["election"] == "leader"
            ha.kill_leader()
            wait_all_found(b, keys, 61, timeout=30)
            wait_baseline(ha, {1: a, 2: b})
        finally:
            ha.etcd.stop()
    finally:
        HaCluster.ctl_tls = ()


HA_EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "ha"
HA_EXAMPLE_PORTS = (2379, 2380, 50251, 50252, 50260, 50261, 50262, 50263, 9480, 9481, 9482, 9483,
                    50271, 50272)


def test_the_readme_example_starts_and_fails_over(daemon_factory, tmp):
    """The README's standby-masters example: etcd on 127.0.0.1:2379 and configs/ha/ verbatim."""
    if not HA_EXAMPLE.exists():
        pytest.skip("configs/ is not beside these tests (the installed-wheel run copies only "
                    "tests/python; the run from the tree covers this)")
    busy = [p for p in HA_EXAMPLE_PORTS if not port_is_free(p)]
    if busy:
        pytest.skip(f"the example's ports are in use here: {busy}")
    etcd = subprocess.Popen(
        [etcd_binary(), "--data-dir", str(tmp / "fluxon-etcd"), "--listen-client-urls",
         "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379"],
        stdout=open(tmp / "etcd.log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while "ready to serve client requests" not in (tmp / "etcd.log").read_text():
            assert etcd.poll() is None and time.time() < deadline, (tmp / "etcd.log").read_text()
            time.sleep(0.05)
        d = {f: daemon_factory((HA_EXAMPLE / f"{f}.yaml").read_text(), name=f)
             for f in ("master-a", "master-b", "owner-a", "owner-b")}

        def status(port):
            r = subprocess.run([FLUXONCTL, "--admin", f"127.0.0.1:{port}", "--json", "status"],
                               capture_output=True, text=True, timeout=20)
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)
        deadline = time.time() + 20
        while sorted(status(p).get("election") for p in (50260, 50261)) != ["leader", "standby"]:
            assert time.time() < deadline, [status(p) for p in (50260, 50261)]
            time.sleep(0.1)
        leader = 50260 if status(50260)["election"] == "leader" else 50261
        for port in (50262, 50263):
            s = status(port)
            assert s["election"] == "follower" and s["leader_address"] in (
                "127.0.0.1:50251", "127.0.0.1:50252"), s
        a = fluxon.KvClient(socket_path="/tmp/fluxon/ha-owner-a.sock")
        b = fluxon.KvClient(socket_path="/tmp/fluxon/ha-owner-b.sock")
        keys = keys_of("readme", 8)
        put_pages(a, keys, seed=7)
        killed = d["master-a" if leader == 50260 else "master-b"]
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(timeout=10)
        wait_all_found(b, keys, 7, timeout=30)
        other = 50261 if leader == 50260 else 50260
        assert status(other)["election"] == "leader"
    finally:
        etcd.terminate()
        etcd.wait(timeout=10)
