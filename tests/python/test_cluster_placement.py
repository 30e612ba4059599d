"""Owner capacity in the master and replica placement, across real fluxond processes on loopback:
a master whose replica_task_placement is restricted to remote-only roles (remote_cache), two
owners and a remote_cache, each its own process and config. Every owner reports its capacity with
each heartbeat; `fluxonctl owners` shows it and `fluxonctl placement` previews where replicas of
a source's atomic groups would go (whole groups, never the source, NoSpace rather than a GPU
owner). Every wait is bounded.
"""

import signal
import subprocess
import time

import pytest

import kv_pages
from conftest import free_port
from test_cluster_remote_get import FLUXONCTL, Cluster

GIB = 1 << 30
MIB = 1 << 20
VALUE_LEN = 256 * 1024
STRICT = (", replica_task_placement: {remote_only_node_roles: [remote_cache], "
          "restrict_to_remote_only_node_roles: true}")


class PlacementCluster(Cluster):
    def start_remote_cache(self, node=3, name=None):
        self.admin[node] = free_port()
        d = self.factory(f"""
role: remote_cache
node_id: {node}
log_level: info
admin: {{listen_address: "127.0.0.1:{self.admin[node]}", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{self.master_port}"
  segment: {{size: 1GiB}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
""", name=name or f"remote-cache-{node}")
        self.daemons[node] = d
        return d

    def placement(self, source, *group_bytes):
        return self.ctl(self.master_admin, "placement", "--source", str(source), "--group-bytes",
                        ",".join(str(b) for b in group_bytes))["groups"]


def fluxonctl(admin_port, *args):
    return subprocess.run([FLUXONCTL, "--admin", f"127.0.0.1:{admin_port}", *args],
                          capture_output=True, text=True, timeout=20)


def wait_for(fn, timeout=5.0, what="condition"):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def capacity(owner):
    c = owner.get("capacity", {})
    return {k: int(c.get(k, 0)) for k in ("segment_bytes", "free_bytes", "committed_bytes",
                                          "evictable_bytes")}


def test_heartbeat_reports_capacity_and_owners_shows_it(daemon_factory, tmp):
    c = PlacementCluster(daemon_factory, tmp, owners=2, lease_ms=1000, grace_ms=500)
    owners = c.owners()
    for node in (1, 2):
        cap = capacity(owners[node])
        assert cap["segment_bytes"] == GIB, owners[node]
        assert 0 < cap["free_bytes"] <= GIB
        assert cap["committed_bytes"] == 0
    # 64 values of 256 KiB on owner 1: its next heartbeat reports them committed.
    kv_pages.put_pages(c.client(1), [f"cap-{i}" for i in range(64)], 7, VALUE_LEN)
    committed = wait_for(lambda: capacity(c.owners()[1])["committed_bytes"] >= 64 * VALUE_LEN,
                         what="owner 1 to report its committed bytes")
    assert committed
    cap = capacity(c.owners()[1])
    assert cap["free_bytes"] <= GIB - 64 * VALUE_LEN
    assert cap["evictable_bytes"] == cap["committed_bytes"]
    assert capacity(c.owners()[2])["committed_bytes"] == 0
    # The table form has the columns.
    out = fluxonctl(c.master_admin, "owners")
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0].split()
    for column in ("FREE_BYTES", "COMMITTED_BYTES", "EVICTABLE_BYTES"):
        assert column in header, out.stdout


def test_strict_placement_goes_to_the_remote_cache_or_is_nospace(daemon_factory, tmp):
    c = PlacementCluster(daemon_factory, tmp, owners=2, lease_ms=1000, grace_ms=500,
                         master_extra=STRICT)
    # Two GPU-side owners only: strict placement has no candidate, and never falls back.
    groups = c.placement(1, 4 * MIB)
    assert len(groups) == 1 and not groups[0].get("placed", False), groups
    assert "NoSpace" in groups[0]["reason"]

    rc = c.start_remote_cache(3)
    wait_for(lambda: 3 in c.owners(), what="the remote_cache to register")
    groups = c.placement(1, 4 * MIB, 8 * MIB, 4 * MIB)
    assert [g.get("node_id") for g in groups] == [3, 3, 3], groups
    assert all(g["role"] == "remote_cache" and g["address"] for g in groups)
    # A group larger than the remote_cache's room is NoSpace; the others still place (whole
    # groups, never split).
    groups = c.placement(1, 4 * MIB, 2 * GIB)
    assert groups[0].get("node_id") == 3 and groups[0]["placed"]
    assert not groups[1].get("placed", False) and "NoSpace" in groups[1]["reason"]
    # The remote_cache itself as the source has no target (never the source).
    assert not c.placement(3, MIB)[0].get("placed", False)

    # kill -9 of the remote_cache: once its lease runs out it is no target.
    rc.proc.send_signal(signal.SIGKILL)
    rc.proc.wait(timeout=10)
    wait_for(lambda: not c.placement(1, MIB)[0].get("placed", False), timeout=5.0,
             what="the dead remote_cache to stop being a target")


def test_unrestricted_placement_prefers_remote_cache_then_other_owners(daemon_factory, tmp):
    c = PlacementCluster(daemon_factory, tmp, owners=2, lease_ms=1000, grace_ms=500)
    groups = c.placement(1, 4 * MIB)
    assert groups[0].get("node_id") == 2, groups  # another owner: not the source
    c.start_remote_cache(3)
    wait_for(lambda: 3 in c.owners(), what="the remote_cache to register")
    assert c.placement(1, 4 * MIB)[0].get("node_id") == 3


def test_placement_refuses_bad_requests(daemon_factory, tmp):
    c = PlacementCluster(daemon_factory, tmp, owners=1, lease_ms=1000, grace_ms=500)
    zero = fluxonctl(c.master_admin, "placement", "--source", "1", "--group-bytes", "0")
    assert zero.returncode != 0
    missing = fluxonctl(c.master_admin, "placement", "--source", "1")
    assert missing.returncode != 0 and "group-bytes" in missing.stdout + missing.stderr
