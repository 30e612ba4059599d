"""write_through=True with real processes: a master restricted to remote_cache targets, owners 1
and 2 and a remote_cache (node 3), each its own fluxond.

A write-through put's future completes only once every value has a committed, routed copy on
another node (here the remote_cache): right after it, the route names both, and with owner 1
killed (-9) owner 2 reads every value byte-exact from the remote_cache. With no other node to
copy to the future fails with a clear error and the local copy stays routed; the parent rule
holds (a child is not reported backed while its parent is not). Every wait is bounded.
"""


import pytest

import fluxon
from test_cluster_placement import STRICT, PlacementCluster
from test_cluster_remote_get import expect_pages, get_pages, keys_of
from test_cluster_replicas import (CacheStats, ReplicaCluster, kill_until_lease_ends, put_values,
                                   wait_baseline)


def put(client, keys, seed, write_through=True, parent=None, groups=None):
    return put_values(client, keys, seed, fluxon.PutOptionalArgs(
        write_through=write_through, parent_key=parent, atomic_group_lens=groups))


def test_a_write_through_put_completes_once_its_copies_are_routed(daemon_factory, tmp):
    c = ReplicaCluster(daemon_factory, tmp)
    a, b = c.client(1), c.client(2)
    keys = keys_of("wt", 64)
    put(a, keys, seed=5, groups=[4] * 16).wait(30)
    # Completed means routed elsewhere: no wait here.
    locations = c.all_locations("wt")
    assert len(locations) == 64
    assert all(nodes == [1, 3] for nodes in locations.values()), locations
    s = a.stats()
    assert s["replica_tasks_completed"] == 64, s
    assert s["write_through_puts"] == 0, s
    # A child naming the last page as its parent: the parent is backed, so the child is too.
    child = keys_of("wt-child", 8)
    put(a, child, seed=70, parent=keys[-1]).wait(30)
    assert all(c.locations(k) == [1, 3] for k in child)

    kill_until_lease_ends(c, 1)
    n, data = get_pages(b, keys)
    assert n == 64
    expect_pages(data, n, seed=5)
    wait_baseline(c, {2: b, 3: CacheStats(c)})


def test_a_child_of_a_parent_not_backed_elsewhere_is_not_reported_backed(daemon_factory, tmp):
    c = ReplicaCluster(daemon_factory, tmp)
    a, b = c.client(1), c.client(2)
    parent = keys_of("wp", 4)
    put(a, parent, seed=1, write_through=False).wait(30)  # local only
    child = keys_of("wp-child", 4)
    with pytest.raises(fluxon.FluxonError, match="parent_key 'wp-3' is not backed"):
        put(a, child, seed=9, parent=parent[-1]).wait(30)
    # The child's values are routed and read back right (copied, only not reported backed).
    n, data = get_pages(b, child)
    assert n == 4
    expect_pages(data, n, seed=9)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)})


def test_with_no_other_node_to_copy_to_the_put_fails_and_stays_local(daemon_factory, tmp):
    # Strict placement and no remote_cache: nowhere to copy.
    c = PlacementCluster(daemon_factory, tmp, owners=2, master_extra=STRICT)
    a, b = c.client(1), c.client(2)
    keys = keys_of("wn", 8)
    with pytest.raises(fluxon.NoSpaceError, match="write_through: no other node had room"):
        put(a, keys, seed=3).wait(30)
    # The local copy stays routed.
    assert all([int(loc["node_id"]) for loc in c.route(k)["route"]["locations"]] == [1]
               for k in keys)
    n, data = get_pages(b, keys)
    assert n == 8
    expect_pages(data, n, seed=3)
    assert a.stats()["write_through_puts"] == 0
