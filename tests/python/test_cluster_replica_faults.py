"""Replicas by pull under faults, with real processes (docs/replicas.md): a master restricted to
remote_cache targets, owners 1 and 2 and a remote_cache (node 3), each its own fluxond and config.
Owner 1 puts with make_replica_task; the remote_cache pulls. Each test injects one fault — the
target or the source killed (-9) mid-pull, a lost PullReplicas answer, a delete or a re-put of
the key racing the pull, a full remote_cache, a remote_cache restart, a master restart
mid-replication — and checks what the design promises: no route ever names a copy that does not
exist, the source keeps its copy, a retry makes no second copy, only a route that still names
the pulled identity is joined, every reader gets the bytes that were written, and every task
ends in exactly one outcome. Every temporary state ends at baseline; every wait is bounded.
"""

import signal
import time

import pytest

from test_cluster_remote_get import expect_pages, get_pages, keys_of, put_pages, wait_pins
from test_cluster_replicas import (CacheStats, ReplicaCluster, put_replicated, wait_baseline,
                                   wait_replicated)

@pytest.fixture
def four_nodes(daemon_factory, tmp):
    return ReplicaCluster(daemon_factory, tmp)


def wait_until(fn, timeout, what):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def kill(daemon):
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(timeout=10)


def accounted(s):
    """Every enqueued task ended in exactly one outcome."""
    ended = sum(s.get(f"replica_tasks_{o}", 0) for o in (
        "completed", "already_held", "obsolete", "source_gone", "no_space", "failed"))
    assert ended == s["replica_tasks_enqueued"], s
    assert s.get("replica_queue_keys", 0) == 0, s


def test_target_killed_mid_pull_leaves_no_route_to_a_partial_copy(four_nodes):
    c = four_nodes
    a, b = c.client(1), c.client(2)
    keys = keys_of("tk", 4)
    c.fault(3, "peer.read", "delay", delay_ms=5000, count=1)
    put_replicated(a, keys, seed=11)
    wait_pins(c, 1, len(keys))  # the remote_cache's read of owner 1 is under way
    kill(c.daemons[3])
    s = wait_replicated(a, len(keys))
    assert s["replica_tasks_failed"] == len(keys) and s["replica_tasks_completed"] == 0, s
    accounted(s)
    for k in keys:
        assert c.locations(k) == [1], k  # never a route to the dead target's partial copy
    n, data = get_pages(b, keys)  # the source kept its copy
    assert n == len(keys)
    expect_pages(data, n, seed=11)
    # The restarted remote_cache is a new generation: it holds nothing and no route names it.
    c.start_remote_cache(3)
    assert c.cache_stats()["committed_entries"] == 0
    assert all(3 not in c.locations(k) for k in keys)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)}, timeout=20)


def test_source_killed_mid_pull_installs_nothing_on_the_target(four_nodes):
    c = four_nodes
    a = c.client(1)
    keys = keys_of("sk", 4)
    c.fault(3, "peer.read", "delay", delay_ms=1500, count=1)
    put_replicated(a, keys, seed=12)
    wait_pins(c, 1, len(keys))
    kill(c.daemons[1])
    cache = CacheStats(c)
    wait_until(lambda: sum(cache.stats().get(f"replica_pulls_{o}", 0) for o in (
        "completed", "failed", "source_gone", "obsolete", "no_space", "already_held")) == 4,
        15, "the remote_cache's pulls to end")
    s = cache.stats()
    assert s["replica_pulls_completed"] == 0 and s["committed_entries"] == 0, s
    wait_until(lambda: all(3 not in c.locations(k) for k in keys), 5, "no copy routed")
    wait_baseline(c, {3: cache}, timeout=20)


def test_a_lost_pull_answer_is_retried_and_finds_the_copy_held(four_nodes):
    c = four_nodes
    a, b = c.client(1), c.client(2)
    keys = keys_of("lost", 6)
    c.fault(1, "peer.PullReplicas", "drop", count=1)  # the pull runs; its answer is lost
    put_replicated(a, keys, seed=13)
    s = wait_replicated(a, len(keys))
    assert s["replica_tasks_already_held"] == len(keys), s
    assert s["replica_tasks_completed"] == 0 and s["replica_pull_calls"] == 2, s
    accounted(s)
    cs = c.cache_stats()
    assert cs["replica_pulls_completed"] == len(keys)
    assert cs["replica_pulls_already_held"] == len(keys)
    for k in keys:
        assert c.locations(k) == [1, 3], k  # one copy, not two
    assert c.master_stats()["master_replica_copies_remote_cache"] == len(keys)
    kill(c.daemons[1])
    wait_until(lambda: c.owners().get(1, {}).get("lease_ms_left", 0) == 0, 10, "owner 1's lease")
    n, data = get_pages(b, keys)
    assert n == len(keys)
    expect_pages(data, n, seed=13)
    wait_baseline(c, {2: b, 3: CacheStats(c)})


def test_a_delete_racing_the_pull_is_never_routed_afterwards(four_nodes):
    c = four_nodes
    a = c.client(1)
    keys = keys_of("del", 4)
    # The batch is formed (the values are held), then held back before placement; meanwhile
    # the values are deleted at the source, so the target's pull finds no route.
    c.fault(1, "master.PlaceReplicas", "delay", delay_ms=1500, count=1)
    put_replicated(a, keys, seed=14)
    wait_until(lambda: a.stats()["replica_queue_keys"] == len(keys), 5, "the batch to form")
    assert a.delete_prefix("del-") == (len(keys), 0)
    s = wait_replicated(a, len(keys))
    assert s["replica_tasks_source_gone"] == len(keys), s
    accounted(s)
    assert c.cache_stats()["committed_entries"] == 0
    assert all(c.locations(k) == [] for k in keys)
    n, _ = get_pages(c.client(2), keys)
    assert n == 0
    wait_baseline(c, {1: a, 3: CacheStats(c)})


def test_a_re_put_racing_the_pull_keeps_the_newer_value(four_nodes):
    c = four_nodes
    a, b = c.client(1), c.client(2)
    keys = keys_of("rep", 4)
    c.fault(1, "master.PlaceReplicas", "delay", delay_ms=1500, count=1)
    put_replicated(a, keys, seed=15)
    wait_until(lambda: a.stats()["replica_queue_keys"] == len(keys), 5, "the batch to form")
    assert a.delete_prefix("rep-") == (len(keys), 0)
    put_pages(a, keys, seed=77)  # a newer value of every key, no replicas asked
    s = wait_replicated(a, len(keys))
    assert s["replica_tasks_obsolete"] == len(keys), s  # the old identity is never copied
    accounted(s)
    assert c.cache_stats()["committed_entries"] == 0
    assert all(c.locations(k) == [1] for k in keys)
    n, data = get_pages(b, keys)
    assert n == len(keys)
    expect_pages(data, n, seed=77)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)})


def test_a_full_remote_cache_evicts_its_own_copies_only(daemon_factory, tmp):
    """A 512 MiB remote_cache takes more replicas than fit: it is a cache tier, so the master
    keeps placing on it (its evictable copies are room) and it evicts its oldest copies by its
    policy; the master removes exactly those locations (the source's stay). Every task
    completes: a full cache is no reason for NoSpace. The remote_cache's copies and the routes
    naming it agree."""
    c = ReplicaCluster(daemon_factory, tmp, cache_segment="512MiB")
    a, b = c.client(1), c.client(2)
    batches = [keys_of(f"full{j}", 256) for j in range(10)]  # 2,560 x 256 KiB = 640 MiB
    for j, keys in enumerate(batches):
        put_replicated(a, keys, seed=j)
        wait_replicated(a, 256 * (j + 1), timeout=30)
    s = a.stats()
    accounted(s)
    assert s["replica_tasks_completed"] == 2560, s
    assert s["replica_tasks_no_space"] == 0, s
    cs = c.cache_stats()
    assert cs["evicted_pages"] > 0, cs
    assert cs["replica_pulls_completed"] == 2560, cs

    def routed_on_cache():
        return sum(3 in nodes for nodes in c.all_locations("full").values())
    wait_until(lambda: routed_on_cache() == c.cache_stats()["committed_entries"], 10,
               "the routes naming the remote_cache to match its copies")
    routes = c.all_locations("full")
    assert len(routes) == 2560
    assert all(1 in nodes for nodes in routes.values())  # the source's locations stay
    # The newest batch was pulled last: the remote_cache evicted older copies, not these.
    assert all(3 in routes[k] for k in batches[-1]), [routes[k] for k in batches[-1]]
    n, data = get_pages(b, batches[-1])
    assert n == 256
    expect_pages(data, n, seed=len(batches) - 1)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)})


def test_a_master_restart_mid_replication_keeps_exactly_the_copies_that_exist(four_nodes):
    c = four_nodes
    a, b = c.client(1), c.client(2)
    done = keys_of("mr-done", 4)
    put_replicated(a, done, seed=16)
    wait_replicated(a, len(done))
    keys = keys_of("mr", 4)
    c.fault(3, "peer.read", "delay", delay_ms=2000, count=1)
    put_replicated(a, keys, seed=17)
    wait_pins(c, 1, len(keys))
    kill(c.master)
    c.restart_master()
    wait_until(lambda: {1, 2, 3} <= set(c.owners()), 10, "the owners to register again")
    wait_until(lambda: a.stats().get("replica_queue_keys", 1) == 0, 30, "the replica tasks")
    accounted(a.stats())
    # Routes are rebuilt from what the owners hold: a copy is routed iff it exists.
    cache_state = {}
    for k in done + keys:
        r = c.ctl(c.admin[3], "route", k, check=False)
        cache_state[k] = r.get("local_state") if isinstance(r, dict) else None

    def agree():
        return all((3 in c.locations(k)) == (cache_state[k] == "committed") and
                   1 in c.locations(k) for k in done + keys)
    wait_until(agree, 10, "the republished routes to match the copies")
    assert all(cache_state[k] == "committed" for k in done), cache_state
    for k, seed in ((done, 16), (keys, 17)):
        n, data = get_pages(b, k)
        assert n == len(k)
        expect_pages(data, n, seed=seed)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)}, timeout=20)
