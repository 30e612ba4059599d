"""Recoverable-first eviction with real processes (design §7): a master restricted to
remote_cache targets, owners 1 and 2 and a remote_cache (node 3), each its own fluxond.

Owner 1 (1 GiB) holds a replicated batch (copied on the remote_cache) that it put first and a
batch without replicas put after it, then fills up. Under pressure it evicts the replicated
values first — every value it lets go still has its remote_cache location, so nothing leaves the
cluster — and keeps the unreplicated batch. Owner 2 reads every value byte-exact afterwards.
Temporary state ends at baseline; every wait is bounded.
"""

import signal
import time

from test_cluster_remote_get import expect_pages, get_pages, keys_of, put_pages
from test_cluster_replicas import CacheStats, ReplicaCluster, put_replicated, wait_baseline, \
    wait_replicated


def test_an_owner_under_pressure_evicts_its_copied_values_first(daemon_factory, tmp):
    c = ReplicaCluster(daemon_factory, tmp)
    a, b = c.client(1), c.client(2)
    copied = keys_of("rf-copied", 256)  # 64 MiB, put first: the oldest values
    put_replicated(a, copied, seed=11)
    s = wait_replicated(a, len(copied))
    assert s["replica_tasks_completed"] == len(copied), s
    assert s["cohorts_marked_copied"] == len(copied), s  # one cohort per key (no groups)
    assert s["hot_copied_cohorts"] == len(copied), s
    alone = keys_of("rf-alone", 256)  # 64 MiB without a copy anywhere
    put_pages(a, alone, seed=12)
    # Fill owner 1 past its watermark (0.95 of 1 GiB): 13 x 64 MiB + 32 MiB more.
    fill = [keys_of(f"rf-fill{j}", 256) for j in range(13)] + [keys_of("rf-fill13", 128)]
    for j, keys in enumerate(fill):
        put_pages(a, keys, seed=20 + j)

    deadline = time.time() + 15
    while a.stats()["evicted_pages"] == 0:
        assert time.time() < deadline, "owner 1 never evicted"
        time.sleep(0.05)
    time.sleep(0.3)  # let the round in progress finish
    s = a.stats()
    # Every value evicted so far was a copied one, each removed only while its remote_cache
    # copy stayed routed.
    assert s["evicted_pages"] == s["evicted_copied_pages"] > 0, s
    assert s["eviction_kept_sole"] == 0, s
    locations = c.all_locations("rf-")
    gone = [k for k in copied if 1 not in locations[k]]
    assert len(gone) == s["evicted_copied_pages"], (len(gone), s)
    assert all(locations[k] == [3] for k in gone)
    assert all(locations[k] == [1] for k in alone)  # the values without a copy stay
    assert all(locations[k] == [1] for keys in fill for k in keys)

    # Every value is still in the cluster, with its bytes: owner 2 reads them all.
    for keys, seed in [(copied, 11), (alone, 12), (fill[-1], 20 + len(fill) - 1)]:
        n, data = get_pages(b, keys)
        assert n == len(keys)
        expect_pages(data, n, seed)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)})


DEMOTION = """\
  demotion: {enabled: true, start_ratio: 0.5, max_bytes_in_flight: 64MiB}"""


def test_demotion_moves_cold_values_to_the_remote_cache_as_the_only_copy(daemon_factory, tmp):
    """Owner 1 (1 GiB, demotion from half full) puts 704 MiB without replicas: it demotes its
    coldest values to the remote_cache ahead of pressure. Each demoted value ends with exactly
    one routed copy — on the remote_cache — and owner 1's slots of it are free; nothing was
    deleted. Owner 2 reads every value byte-exact; after owner 1 is killed (-9) the demoted
    values still read from the remote_cache."""
    c = ReplicaCluster(daemon_factory, tmp, owner_extra=DEMOTION)
    a, b = c.client(1), c.client(2)
    batches = [keys_of(f"dm{j}", 256) for j in range(11)]  # 11 x 64 MiB
    for j, keys in enumerate(batches):
        put_pages(a, keys, seed=40 + j)
    used_after_puts = 11 * 256 * (256 << 10)

    deadline = time.time() + 30
    while True:
        s = a.stats()
        if s["demoted_pages"] > 0 and s["demoting_bytes"] == 0 and \
                s["committed_entries"] * (256 << 10) <= (1 << 30) // 2:
            break
        assert time.time() < deadline, {k: v for k, v in s.items() if "demot" in k or
                                        k in ("committed_entries", "evicted_pages")}
        time.sleep(0.05)
    s = a.stats()
    assert s["evicted_pages"] == s["evicted_copied_pages"], s  # nothing deleted outright
    assert s["demotion_no_space"] == 0 and s["demotion_failed"] == 0, s
    locations = c.all_locations("dm")
    assert len(locations) == 11 * 256  # every value still routed
    assert all(len(nodes) == 1 for nodes in locations.values()), "one copy at rest"
    on_cache = [k for k, nodes in locations.items() if nodes == [3]]
    # Capacity counted once: the master's logical bytes equal its physical bytes (no value
    # has two copies at rest), and owner 1's routed bytes went down by what it demoted.
    owners = c.ctl(c.master_admin, "owners")
    cluster = owners["cluster"]
    assert int(cluster["logical_bytes"]) == int(cluster["physical_bytes"]) == \
        len(locations) * (256 << 10), cluster
    by_node = {int(o["node_id"]): o for o in owners["owners"]}
    assert int(by_node[3]["routed_bytes"]) == len(on_cache) * (256 << 10)
    assert int(by_node[1]["routed_bytes"]) == (len(locations) - len(on_cache)) * (256 << 10)
    assert len(on_cache) == s["demoted_pages"]
    assert s["committed_entries"] == len(locations) - len(on_cache)
    assert s["committed_entries"] * (256 << 10) < used_after_puts
    # The policy's victim chain stays the victim until it is empty: whole batches move.
    moved = [j for j, keys in enumerate(batches) if all(locations[k] == [3] for k in keys)]
    assert moved, [sum(locations[k] == [3] for k in keys) for keys in batches]

    for j, keys in enumerate(batches):
        n, data = get_pages(b, keys)
        assert n == len(keys), j
        expect_pages(data, n, seed=40 + j)
    wait_baseline(c, {1: a, 2: b, 3: CacheStats(c)})

    c.daemons[1].proc.send_signal(signal.SIGKILL)
    c.daemons[1].proc.wait(timeout=10)
    for j in moved:
        n, data = get_pages(b, batches[j])
        assert n == len(batches[j])
        expect_pages(data, n, seed=40 + j)
