"""Replicas by pull with real processes (docs/replicas.md), each node its own fluxond and config.

The target's side: owner 1 pulls copies of values owner 2 put (`fluxonctl pull`, the owners'
peer service on owner 1's admin port): each copy is exactly the routed identity, a second pull
makes no second copy, and after owner 2 is killed (-9) owner 1 still reads every value
byte-exact from its own copies.

The source asks: puts with make_replica_task on owner 1 are copied to a remote_cache (node 3)
that a strict master picks (never a GPU owner); the counts agree end to end (completed pulls =
copies the master appended = its replica target count), and after owner 1 is killed (-9) owner 2
reads every value byte-exact from the remote_cache. Temporary state ends at baseline.
"""

import signal
import time

import numpy as np
import pytest

import fluxon
from conftest import free_port
from test_cluster_placement import STRICT, PlacementCluster
from test_cluster_remote_get import (VALUE_LEN, cluster, expect_pages, get_pages,  # noqa: F401
                                     keys_of, put_pages, wait_baseline)


def pull(cluster, node, keys):
    doc = cluster.ctl(cluster.admin[node], "pull", *keys)
    return {o["key"]: o["outcome"] for o in doc["outcomes"]}


def test_pulled_copies_outlive_their_source(cluster):
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("pl", 6)
    put_pages(b, keys, seed=57)
    routes = {k: cluster.route(k)["route"] for k in keys}
    assert set(pull(cluster, 1, keys).values()) == {"PULL_COMPLETED"}
    for k in keys:
        route = cluster.route(k)["route"]
        assert len(route["locations"]) == 2, route
        assert {int(loc["node_id"]) for loc in route["locations"]} == {1, 2}
        # The copy is the routed identity: same put_id and version at both locations.
        for loc in route["locations"]:
            assert int(loc["put_id"]) == int(routes[k]["put_id"])
            assert int(loc.get("version", 0)) == int(routes[k].get("version", 0))
    assert a.stats()["replica_pulls_completed"] == len(keys)
    # A retry (an uncertain call repeated) makes no second copy.
    assert set(pull(cluster, 1, keys).values()) == {"PULL_ALREADY_HELD"}
    assert all(len(cluster.route(k)["route"]["locations"]) == 2 for k in keys)

    cluster.daemons[2].proc.send_signal(signal.SIGKILL)
    cluster.daemons[2].proc.wait(timeout=10)
    remote_before = a.stats()["remote_get_keys"]
    n, data = get_pages(a, keys)
    assert n == len(keys)
    expect_pages(data, n, seed=57)
    assert a.stats()["remote_get_keys"] == remote_before, "owner 1 read its own copies"
    wait_baseline(cluster, {1: a})


def test_pull_of_an_unrouted_key_copies_nothing(cluster):
    a, b = cluster.client(1), cluster.client(2)
    put_pages(b, ["gone-0"], seed=3)
    assert b.delete_prefix("gone-") == (1, 0)
    assert pull(cluster, 1, ["gone-0"]) == {"gone-0": "NO_ROUTE"}
    n, _ = get_pages(a, ["gone-0"])
    assert n == 0
    wait_baseline(cluster, {1: a, 2: b})


# --- The source asks: make_replica_task (the source's replica queue, owner/replica_queue.h) ---

SETTLED = ("replica_tasks_completed", "replica_tasks_already_held", "replica_tasks_obsolete",
           "replica_tasks_source_gone", "replica_tasks_no_space", "replica_tasks_failed")


def put_values(client, keys, seed, opts):
    """Puts `keys` (page i filled with (seed + i) % 251) with `opts`; the commit's future."""
    plan = client.local_fast_put_start(keys, VALUE_LEN, opts)
    buf = np.empty(len(keys) * VALUE_LEN, dtype=np.uint8)
    for i in range(len(keys)):
        buf[i * VALUE_LEN:(i + 1) * VALUE_LEN] = (seed + i) % 251
    fluxon.copy_to_plan(plan, buf.ctypes.data, VALUE_LEN)
    return client.local_fast_put_commit(plan)


def put_replicated(client, keys, seed, mask=None, groups=None):
    put_values(client, keys, seed, fluxon.PutOptionalArgs(
        make_replica_task=True, make_replica_task_mask=mask, atomic_group_lens=groups)).wait(10)


def wait_replicated(client, n, timeout=15.0):
    """Until `n` replica tasks of the client's owner ended (any outcome); returns its stats."""
    deadline = time.time() + timeout
    while True:
        s = client.stats()
        if sum(s.get(k, 0) for k in SETTLED) >= n and s.get("replica_queue_keys", 0) == 0:
            return s
        assert time.time() < deadline, {k: s.get(k) for k in SETTLED + ("replica_tasks_enqueued",)}
        time.sleep(0.05)


def kill_until_lease_ends(cluster, node):
    """kill -9 of `node`, then wait until its lease runs out: until then the master still hands
    out the dead owner's locations (a read of one fails: a miss); from then on only copies on
    other nodes are sources."""
    cluster.daemons[node].proc.send_signal(signal.SIGKILL)
    cluster.daemons[node].proc.wait(timeout=10)
    deadline = time.time() + 10
    while cluster.owners().get(node, {}).get("lease_ms_left", 0) > 0:
        assert time.time() < deadline, f"owner {node}'s lease never ran out"
        time.sleep(0.05)


class ReplicaCluster(PlacementCluster):
    """A master restricted to remote_cache targets, owners 1 and 2, a remote_cache (node 3) whose
    admin port takes fault rules."""

    def __init__(self, factory, tmp, cache_segment="1GiB", **kw):
        self.cache_segment = cache_segment
        super().__init__(factory, tmp, owners=2, master_extra=STRICT, **kw)
        self.start_remote_cache(3)

    def start_remote_cache(self, node=3, name=None):
        """Starts (or restarts: a new generation) the remote_cache and waits until the master
        knows its new generation and peer service."""
        before = self.owners().get(node, {}).get("generation")
        self.admin[node] = free_port()
        d = self.factory(f"""
role: remote_cache
node_id: {node}
log_level: info
admin: {{listen_address: "127.0.0.1:{self.admin[node]}", metrics_port: 0, allow_mutations: true}}
owner:
  master_address: "127.0.0.1:{self.master_port}"
  segment: {{size: {self.cache_segment}}}
  heartbeat_interval_ms: 200
  data_address: "127.0.0.1:0"
  remote_get_timeout_ms: {self.remote_timeout_ms}
  local_reserve: {{claim_soft_timeout_ms: 5, claim_hard_timeout_ms: 1000}}
  eviction_interval_ms: 10
""", name=name or f"remote-cache-{node}-{time.time_ns()}")
        self.daemons[node] = d
        deadline = time.time() + 15
        while True:
            o = self.owners().get(node, {})
            if o.get("peer_address") and o.get("generation") != before:
                return d
            assert time.time() < deadline, "the remote_cache never registered its peer service"
            time.sleep(0.05)

    def cache_stats(self, node=3):
        """The remote_cache's owner counters, named as a client's stats() names them."""
        return {k[len("owner_"):]: v for k, v in self.ctl(self.admin[node], "stats").items()
                if k.startswith("owner_")}

    def locations(self, key):
        r = self.ctl(self.master_admin, "route", key, check=False)
        if not isinstance(r, dict) or not r.get("route"):
            return []
        return sorted(int(loc["node_id"]) for loc in r["route"].get("locations", []))


    def all_locations(self, prefix):
        """{key: sorted node_ids} of every route whose key starts with `prefix` (one call)."""
        doc = self.ctl(self.master_admin, "keys", "--prefix", prefix, "--limit", "1000000")
        return {r["key"]: sorted(int(loc["node_id"]) for loc in r.get("locations", []))
                for r in doc["keys"] or []}


class CacheStats:
    """A remote_cache in wait_baseline's clients (it has no client socket)."""

    def __init__(self, cluster, node=3):
        self.cluster, self.node = cluster, node

    def stats(self):
        return self.cluster.cache_stats(self.node)


@pytest.fixture
def four_nodes(daemon_factory, tmp):
    return ReplicaCluster(daemon_factory, tmp)


def test_make_replica_task_copies_to_the_remote_cache_and_outlives_the_source(four_nodes):
    c = four_nodes
    a, b = c.client(1), c.client(2)
    keys = keys_of("rt", 12)
    put_replicated(a, keys, seed=91, groups=[4, 4, 4])
    s = wait_replicated(a, 12)
    assert s["replica_tasks_enqueued"] == 12
    assert s["replica_tasks_completed"] == 12, s
    assert s["replica_targets_remote_cache"] == 12 and s["replica_targets_other_roles"] == 0
    for k in keys:
        locs = c.route(k)["route"]["locations"]
        assert sorted(int(loc["node_id"]) for loc in locs) == [1, 3], locs
        assert len({loc["put_id"] for loc in locs}) == 1
    m = c.master_stats()
    # Completed pulls = copies the master appended = its replica target count; GPU owners: 0.
    assert m["master_replica_copies_remote_cache"] == 12, m
    assert m["master_replica_copies_other_roles"] == 0
    rc = c.ctl(c.admin[3], "stats")
    assert rc["owner_replica_pulls_completed"] == 12, rc

    kill_until_lease_ends(c, 1)
    n, data = get_pages(b, keys)
    assert n == len(keys)
    expect_pages(data, n, seed=91)
    assert b.stats()["remote_hits"] == len(keys)  # read from the remote_cache's copies
    wait_baseline(c, {2: b})


def test_the_mask_selects_whole_groups(four_nodes):
    c = four_nodes
    a = c.client(1)
    keys = keys_of("mask", 4)
    put_replicated(a, keys, seed=5, mask=[True, True, False, False], groups=[2, 2])
    s = wait_replicated(a, 2)
    assert s["replica_tasks_enqueued"] == 2 and s["replica_tasks_completed"] == 2, s
    time.sleep(0.3)  # nothing more arrives
    assert a.stats()["replica_tasks_enqueued"] == 2
    nodes = {k: sorted(int(loc["node_id"]) for loc in c.route(k)["route"]["locations"])
             for k in keys}
    assert nodes == {keys[0]: [1, 3], keys[1]: [1, 3], keys[2]: [1], keys[3]: [1]}, nodes
    b = c.client(2)  # every value reads back byte-exact, copied or not
    n, data = get_pages(b, keys)
    assert n == len(keys)
    expect_pages(data, n, seed=5)
    wait_baseline(c, {1: a, 2: b})


def test_without_a_remote_cache_a_strict_master_places_nothing(daemon_factory, tmp):
    c = PlacementCluster(daemon_factory, tmp, owners=2, master_extra=STRICT)
    a = c.client(1)
    keys = keys_of("ns", 3)
    put_replicated(a, keys, seed=2)
    s = wait_replicated(a, 3)
    assert s["replica_tasks_no_space"] == 3 and s["replica_tasks_completed"] == 0, s
    assert s["replica_targets_other_roles"] == 0
    assert c.master_stats()["master_replica_copies_other_roles"] == 0
    assert all(len(c.route(k)["route"]["locations"]) == 1 for k in keys)
    # The values themselves are stored and readable as always.
    n, data = get_pages(a, keys)
    assert n == 3
    expect_pages(data, 3, seed=2)
    wait_baseline(c, {1: a})
