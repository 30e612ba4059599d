"""Replicas by pull with real processes (docs/replicas.md): a master and two owners, each its own
fluxond and config. Owner 1 pulls copies of values owner 2 put (`fluxonctl pull`, the owners'
peer service on owner 1's admin port): each copy is exactly the routed identity, a second pull
makes no second copy, and after owner 2 is killed (-9) owner 1 still reads every value
byte-exact from its own copies. Temporary state ends at baseline.
"""

import signal

from test_cluster_remote_get import (cluster, expect_pages, get_pages, keys_of,  # noqa: F401
                                     put_pages, wait_baseline)


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
