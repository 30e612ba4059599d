"""Single-copy demotion under faults, with real processes (design §7): a master restricted to
remote_cache targets, owners 1 and 2 and a remote_cache (node 3), each its own fluxond; owner 1
(1 GiB) demotes from half full.

Each test puts 640 MiB through owner 1, injects one fault while demotions run, and checks what
the design promises: a value's local copy stays until its remote copy is routed; no route ever
names a partial copy; a lost swap answer leaves exactly one routed copy; a delete before the
pull wins; without a remote_cache with room the owner deletes under pressure (counted); after a
master restart every value is routed once. Every reader gets the bytes that were written, every
temporary state ends at baseline, every wait is bounded.
"""


from test_cluster_placement import STRICT, PlacementCluster
from test_cluster_remote_get import expect_pages, get_pages, keys_of, put_pages
from test_cluster_replica_faults import kill, wait_until
from test_cluster_replicas import CacheStats, ReplicaCluster, wait_baseline

MIB = 1 << 20
VALUE_LEN = 256 << 10
DEMOTION = """\
  demotion: {enabled: true, start_ratio: 0.5, max_bytes_in_flight: 64MiB}"""


def wait_reading(c, node=1):
    """Until a peer's read of `node`'s values is under way (the master pins them)."""
    wait_until(lambda: int(c.owners()[node].get("source_pins", 0)) > 0, 10,
               f"a read of node {node}'s values")


def put_batches(client, tag, n):
    batches = [keys_of(f"{tag}{j}", 256) for j in range(n)]  # 64 MiB each
    for j, keys in enumerate(batches):
        put_pages(client, keys, seed=j)
    return batches


def settled(s):
    """Every demotion started has ended in one stage, and none is in flight."""
    ended = s["demoted_pages"] + s["demotion_no_space"] + s["demotion_failed"]
    return s["demoting_bytes"] == 0 and s.get("replica_queue_keys", 0) == 0 and \
        ended == s["demotions_started"]


def demotions_done(s, segment=1 << 30, start_ratio=0.5):
    """Owner 1 demoted down to its start ratio and nothing is in flight. `settled` alone also
    holds between two demotion rounds (each round moves at most max_bytes_in_flight), so a test
    that waited for it could read the counters while the next round runs."""
    return s["demoted_pages"] > 0 and settled(s) and \
        s["committed_entries"] * VALUE_LEN <= segment * start_ratio


def expect_all_readable(client, batches):
    for j, keys in enumerate(batches):
        n, data = get_pages(client, keys)
        assert n == len(keys), (j, n)
        expect_pages(data, n, seed=j)


def single_copies(c, prefix, n_keys):
    locations = c.all_locations(prefix)
    assert len(locations) == n_keys
    assert all(len(nodes) == 1 for nodes in locations.values()), \
        [k for k, nodes in locations.items() if len(nodes) != 1][:5]
    return locations


def demoting_cluster(daemon_factory, tmp, **kw):
    return ReplicaCluster(daemon_factory, tmp, owner_extra=DEMOTION, **kw)


def test_remote_cache_killed_mid_demotion_leaves_the_local_copies(daemon_factory, tmp):
    c = demoting_cluster(daemon_factory, tmp)
    a, b = c.client(1), c.client(2)
    c.fault(3, "peer.read", "delay", delay_ms=3000)  # every pull's read hangs
    batches = put_batches(a, "dk", 10)
    wait_until(lambda: a.stats()["demotions_started"] > 0, 10, "a demotion to start")
    wait_reading(c)  # the remote_cache's read of owner 1 is under way
    kill(c.daemons[3])
    wait_until(lambda: settled(a.stats()) and a.stats()["demotion_failed"] > 0, 30,
               "the demotions to end")
    s = a.stats()
    assert s["demoted_pages"] == 0 and s["evicted_pages"] == 0, s
    # Nothing was routed to the dead remote_cache's partial copies; owner 1 keeps every value.
    locations = single_copies(c, "dk", 10 * 256)
    assert all(nodes == [1] for nodes in locations.values())
    assert s["committed_entries"] == 10 * 256
    expect_all_readable(b, batches)
    wait_baseline(c, {1: a, 2: b})


def test_a_lost_swap_answer_leaves_exactly_one_routed_copy(daemon_factory, tmp):
    c = demoting_cluster(daemon_factory, tmp)
    a, b = c.client(1), c.client(2)
    # The first route removal owner 1 asks for (a demotion's swap) is applied, its answer lost.
    c.fault(1, "master.RemoveRoutes", "drop", count=1)
    batches = put_batches(a, "dl", 10)
    wait_until(lambda: demotions_done(a.stats()), 30, "the demotions to end")
    s = a.stats()
    assert s["route_remove_retries"] >= 1, s
    assert s["demoted_pages"] == s["evicted_copied_pages"] == s["evicted_pages"], s
    locations = single_copies(c, "dl", 10 * 256)
    on_cache = [k for k, nodes in locations.items() if nodes == [3]]
    assert len(on_cache) == s["demoted_pages"]
    assert c.cache_stats()["committed_entries"] == len(on_cache)
    expect_all_readable(b, batches)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)})


def test_a_delete_before_the_pull_wins_and_a_racing_get_reads_right_or_misses(daemon_factory,
                                                                              tmp):
    c = demoting_cluster(daemon_factory, tmp)
    a, b = c.client(1), c.client(2)
    # The first demotion batch waits 2 s for its placement: the delete comes first.
    c.fault(1, "master.PlaceReplicas", "delay", delay_ms=2000, count=1)
    batches = put_batches(a, "dd", 10)
    wait_until(lambda: a.stats()["demoting_bytes"] > 0, 10, "a demotion to be under way")
    # A get racing the demotion reads the written bytes (through owner 1: a delete removes the
    # values its owner holds, so a copy another owner fetched would be that owner's to delete).
    n, data = get_pages(a, batches[0])
    assert n == 256
    expect_pages(data, n, seed=0)
    deleted, kept = a.delete_prefix("dd")
    assert kept == 0 and deleted == 10 * 256, (deleted, kept)
    wait_until(lambda: settled(a.stats()), 30, "the demotions to end")
    s = a.stats()
    assert s["demoted_pages"] == 0, s  # nothing of what was deleted moved
    assert c.all_locations("dd") == {}
    assert c.cache_stats()["committed_entries"] == 0
    assert a.stats()["committed_entries"] == 0
    for keys in batches:
        n, _ = get_pages(b, keys)
        assert n == 0
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)})


def test_without_a_remote_cache_pressure_deletes_and_counts_no_space(daemon_factory, tmp):
    c = PlacementCluster(daemon_factory, tmp, owners=2, master_extra=STRICT, owner_extra=DEMOTION)
    a, b = c.client(1), c.client(2)
    batches = put_batches(a, "dn", 18)  # 1,152 MiB into 1 GiB: every put succeeds
    wait_until(lambda: settled(a.stats()), 30, "the demotions to end")
    s = a.stats()
    assert s["demotion_no_space"] > 0, s
    assert s["demoted_pages"] == 0, s
    assert s["evicted_pages"] > 0 and s["evicted_copied_pages"] == 0, s
    n, data = get_pages(b, batches[-1])
    assert n == 256
    expect_pages(data, n, seed=len(batches) - 1)
    wait_baseline(c, {1: a, 2: b})


def test_a_master_restart_mid_demotion_routes_every_value_once(daemon_factory, tmp):
    c = demoting_cluster(daemon_factory, tmp)
    a, b = c.client(1), c.client(2)
    c.fault(3, "peer.read", "delay", delay_ms=2000, count=1)
    batches = put_batches(a, "dr", 10)
    wait_reading(c)  # a demotion's read is under way
    kill(c.master)
    c.restart_master()
    wait_until(lambda: {1, 2, 3} <= set(c.owners()), 10, "the owners to register again")
    wait_until(lambda: demotions_done(a.stats()), 40, "the demotions to end")
    # Once the republished routes settle, every value is routed exactly once, where it is.
    wait_until(lambda: all(len(n) == 1 for n in c.all_locations("dr").values()) and
               len(c.all_locations("dr")) == 10 * 256, 15, "one route per value")
    owners = c.ctl(c.master_admin, "owners")
    assert int(owners["cluster"]["logical_bytes"]) == int(owners["cluster"]["physical_bytes"])
    expect_all_readable(b, batches)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)}, timeout=20)
