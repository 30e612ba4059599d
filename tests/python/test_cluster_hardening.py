"""Cluster hardening with real fluxond processes on loopback (a master and owners, each with its
own config): a peer, a fault or a restart must never make an owner serve another key's or
another version's bytes, nor lose an acknowledged route for good.

Each test reproduces one defect of the cluster-hardening list, compares the bytes every reader
gets with what was written, and ends with every process's temporary state at baseline.
Invariants named: S2 (a slot is freed only after its route is certainly gone), T1 (retries keep
their identity), T2 (only another put_id is stale), V2/V3 (routes are the master's soft state,
restored by the owners' republish), G7/G8.
"""

import os
import signal
import threading
import time

import numpy as np
import pytest

import fluxon
# `cluster`: the fixture of the remote get tests, a master and two owners.
from test_cluster_remote_get import (cluster, expect_pages, get_pages, keys_of,  # noqa: F401
                                     put_pages, wait_baseline, wait_pins, VALUE_LEN)

SMALL = 4096


def put_small(client, keys, seed, value_len=SMALL, timeout=60):
    """Writes page i of `keys` filled with (seed + i) % 251 and waits for the master route."""
    plan = client.local_fast_put_start(keys, value_len)
    buf = np.empty((len(keys), value_len), dtype=np.uint8)
    buf[:] = ((seed + np.arange(len(keys))) % 251).astype(np.uint8)[:, None]
    fluxon.copy_to_plan(plan, buf.ctypes.data, value_len)
    client.local_fast_put_commit(plan).wait(timeout)


def get_small(client, keys, value_len=SMALL):
    """Restores `keys`; returns (hit count, the first byte of each hit page), checking that
    every page holds one byte value throughout."""
    h = client.get_start(keys)
    n = h.result.transferable_len
    if n == 0:
        client.cancel_get_transfer(h)
        return 0, []
    plan = client.get_transfer(h)
    out = np.zeros((n, value_len), dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, value_len)
    client.release_views(plan)
    assert (out == out[:, :1]).all(), "a page mixes bytes of several values"
    return n, [int(v) for v in out[:, 0]]


def wait_until(pred, timeout, what):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_unconfirmed_route_removal_keeps_the_value(cluster):
    """Item 1 / S2: a RemoveRoutes error (here a definite Internal) is not "removed": the delete
    keeps every value, the route still names it, and a peer reading it later gets its bytes, not
    those of values put afterwards."""
    a, b = cluster.client(1), cluster.client(2)
    old = keys_of("old", 24)
    put_pages(a, old, seed=7)
    cluster.fault(1, "master.RemoveRoutes", "refuse")
    deleted, kept = a.delete_prefix("old-")
    assert deleted == 0 and kept == len(old)
    assert a.stats()["route_remove_unconfirmed"] >= len(old)
    assert cluster.route(old[0])  # still routed to owner 1
    cluster.ctl(cluster.admin[1], "fault", "clear")
    # New values take other slots: the old ones were never freed.
    put_pages(a, keys_of("new", 24), seed=101)
    n, data = get_pages(b, old)
    assert n == len(old)
    expect_pages(data, n, seed=7)
    # With the master answering again the delete goes through.
    deleted, kept = a.delete_prefix("old-")
    assert deleted == len(old) and kept == 0
    wait_baseline(cluster, {1: a, 2: b})


def test_delete_of_values_with_long_keys_across_the_master(cluster):
    """Items 1 and 2: 1,200 values with ~3.9 KB keys (a RemoveRoutes of them is > 4 MiB) are
    deleted for real; a peer's later get of an old key misses or returns the old bytes — never a
    new key's bytes."""
    a, b = cluster.client(1), cluster.client(2)
    pad = "k" * 3900
    old = [f"long-old-{i}-{pad}" for i in range(1200)]
    for i in range(0, len(old), 300):
        put_small(a, old[i:i + 300], seed=i)
    deleted, kept = a.delete_prefix("long-old-")
    assert (deleted, kept) == (len(old), 0)
    new = [f"long-new-{i}-{pad}" for i in range(1200)]
    for i in range(0, len(new), 300):
        put_small(a, new[i:i + 300], seed=200 + i)
    n, _ = get_small(b, old[:64])
    assert n == 0, "a deleted key was served by the peer"
    n, firsts = get_small(b, new[:64])
    assert n == 64 and all(f == (200 + i) % 251 for i, f in enumerate(firsts))
    wait_baseline(cluster, {1: a, 2: b})


def test_batch_limits_work_across_the_master(cluster):
    """Item 2: a put of MAX_BATCH_KEYS keys of 117 B (5.4 MB of publish, over gRPC's default 4 MiB)
    and a get_start of all of them from the other owner (the master calls are split below the
    message limit), and 4,000 keys of MAX_KEY_BYTES each (16 MiB of keys in one batch)."""
    a, b = cluster.client(1), cluster.client(2)
    keys = [f"many-{i:06d}-" + "x" * 105 for i in range(fluxon.MAX_BATCH_KEYS)]
    assert len(keys[0]) == 117
    put_small(a, keys, seed=3)
    n, firsts = get_small(b, keys)
    assert n == len(keys)
    assert all(f == (3 + i) % 251 for i, f in enumerate(firsts))
    big = [f"max-{i}-".ljust(fluxon.MAX_KEY_BYTES, "y") for i in range(4000)]
    assert all(len(k) == fluxon.MAX_KEY_BYTES for k in big)
    put_small(a, big, seed=9)
    n, firsts = get_small(b, big)
    assert n == len(big) and all(f == (9 + i) % 251 for i, f in enumerate(firsts))
    wait_baseline(cluster, {1: a, 2: b})


def test_expired_source_never_serves_a_read_its_pin_no_longer_covers(cluster):
    """Item 3: a read from owner 1 is in flight (slowed) while owner 1 is SIGSTOPped past lease
    + grace; owner 1 comes back, deletes the key and puts another value there. The reader gets
    a miss or the key's original bytes, never the new ones, and does not cache anything else."""
    a, b = cluster.client(1), cluster.client(2)
    key = ["victim-0"]
    put_pages(a, key, seed=11)
    cluster.fault(2, "peer.read", "delay", delay_ms=4500, count=1)
    result = {}

    def read():
        result["n"], result["data"] = get_pages(b, key)

    t = threading.Thread(target=read)
    t.start()
    wait_pins(cluster, 1, 1)
    owner1 = cluster.daemons[1]
    os.kill(owner1.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: 1 not in cluster.owners(), 6, "owner 1 to expire")
    finally:
        os.kill(owner1.proc.pid, signal.SIGCONT)
    wait_until(lambda: a.stats().get("generation_renewals", 0) >= 1, 10,
               "owner 1 to register under a new generation")
    wait_until(lambda: a.delete_prefix("victim-")[0] == 1 or a.stats()["keys"] == 0, 10,
               "owner 1 to delete the key")
    put_pages(a, ["other-0", "other-1", "victim-0"], seed=77)
    t.join(timeout=30)
    assert not t.is_alive()
    # The master ended the get with its source's expiry: nothing read under it is used.
    assert result["n"] == 0, "the reader used a read its source's pin no longer covered"
    # Whatever owner 2 holds for the key now is the routed version.
    n, data = get_pages(b, key)
    assert n == 1
    page = data[:VALUE_LEN]
    assert (page == (77 + 2) % 251).all(), "owner 2 serves a stale version"
    wait_baseline(cluster, {1: a, 2: b})


def test_expired_owner_comes_back_with_a_new_generation(cluster):
    """Item 8: after a SIGSTOP past lease + grace the owner finds out (its heartbeat is refused),
    registers under a new generation, republishes its values (the peer reads them again), takes
    new puts, and drops its copy of a key that was deleted and put again elsewhere meanwhile."""
    a, b = cluster.client(1), cluster.client(2)
    mine = keys_of("mine", 8)
    put_pages(a, mine, seed=21)
    theirs = ["shared-0"]
    put_pages(b, theirs, seed=31)
    n, _ = get_pages(a, theirs)  # owner 1 caches a copy of owner 2's value
    assert n == 1
    gen_before = cluster.owners()[1]["generation"]
    owner1 = cluster.daemons[1]
    os.kill(owner1.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: 1 not in cluster.owners(), 6, "owner 1 to expire")
        assert b.delete_prefix("shared-") == (1, 0)
        put_pages(b, theirs, seed=41)  # a new version while owner 1 is away
    finally:
        os.kill(owner1.proc.pid, signal.SIGCONT)
    wait_until(lambda: 1 in cluster.owners(), 10, "owner 1 to be listed again")
    assert cluster.owners()[1]["generation"] != gen_before
    wait_until(lambda: a.stats().get("republish_rounds", 0) >= 1, 10, "the republish")
    n, data = get_pages(b, mine)
    assert n == len(mine)
    expect_pages(data, n, seed=21)
    put_pages(a, keys_of("after", 4), seed=51)  # puts work again
    n, data = get_pages(a, theirs)
    assert n == 1
    assert (data[:VALUE_LEN] == 41 % 251).all(), "owner 1 served its stale copy"
    status = cluster.ctl(cluster.admin[1], "status")
    assert status.get("master_registered") is True
    wait_baseline(cluster, {1: a, 2: b})


def test_master_restart_restores_every_route(cluster):
    """Item 7 and 10: 20 acknowledged puts, master kill -9, restarted 1.5 s later on the same
    port: the owners find it again within about a second, republish, and every value is found
    from the other owner; a key still held is not put twice."""
    a, b = cluster.client(1), cluster.client(2)
    batches = [keys_of(f"b{j}", 4) for j in range(20)]
    for j, keys in enumerate(batches):
        put_pages(a, keys, seed=j)
    cluster.master.proc.send_signal(signal.SIGKILL)
    cluster.master.proc.wait(timeout=10)
    time.sleep(1.5)
    t0 = time.time()
    cluster.restart_master()
    wait_until(lambda: {1, 2} <= set(cluster.owners()), 5, "the owners to register again")
    registered_after = time.time() - t0
    wait_until(lambda: a.stats().get("republish_rounds", 0) >= 1, 10, "the republish")
    for j, keys in enumerate(batches):
        n, data = get_pages(b, keys)
        assert n == len(keys), f"batch {j} is not routed after the restart"
        expect_pages(data, n, seed=j)
    with pytest.raises(fluxon.KeyConflictError):
        a.local_fast_put_start(batches[0], VALUE_LEN)
    assert registered_after < 4.0, registered_after
    wait_baseline(cluster, {1: a, 2: b})


def test_put_ids_do_not_collide_across_owners(cluster):
    """Item 9: fresh owners; owner 2 fetches key x from owner 1 while owner 2's own client's
    put_start([y, x]) conflicts. The conflict's rollback leaves the fetch alone: x becomes a
    local copy on owner 2 with owner 1's bytes, and nothing leaks."""
    a, b = cluster.client(1), cluster.client(2)
    put_pages(a, ["x"], seed=61)
    cluster.fault(2, "peer.read", "delay", delay_ms=800, count=1)
    result = {}
    t = threading.Thread(target=lambda: result.update(r=get_pages(b, ["x"])))
    t.start()
    wait_pins(cluster, 1, 1)
    with pytest.raises(fluxon.KeyConflictError):
        b.local_fast_put_start(["y", "x"], VALUE_LEN)
    t.join(timeout=30)
    n, data = result["r"]
    assert n == 1
    expect_pages(data, 1, seed=61)
    assert b.stats()["remote_hits"] >= 1
    before = b.stats()["remote_get_keys"]
    n, data = get_pages(b, ["x"])  # now a local hit
    assert n == 1 and b.stats()["remote_get_keys"] == before
    expect_pages(data, 1, seed=61)
    wait_baseline(cluster, {1: a, 2: b})


def test_stale_copy_held_by_a_reader_is_never_served_again(cluster):
    """A copy found stale when its owner comes back from expiry leaves the index at once even
    while a reader holds a view of it: every later get on that owner reads the routed version,
    the held view keeps its old bytes until released, and then the slot is freed."""
    a, b = cluster.client(1), cluster.client(2)
    theirs = ["held-0"]
    put_pages(b, theirs, seed=31)
    n, _ = get_pages(a, theirs)  # owner 1 caches a copy of owner 2's version 1
    assert n == 1
    h = a.get_start(theirs)
    assert h.result.all_hit
    held = a.get_transfer(h)  # a reader on owner 1 holds version 1 across everything below
    owner1 = cluster.daemons[1]
    os.kill(owner1.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: 1 not in cluster.owners(), 6, "owner 1 to expire")
        assert b.delete_prefix("held-") == (1, 0)
        put_pages(b, theirs, seed=41)  # version 2, acknowledged, while owner 1 is away
    finally:
        os.kill(owner1.proc.pid, signal.SIGCONT)
    wait_until(lambda: 1 in cluster.owners(), 10, "owner 1 to be listed again")
    wait_until(lambda: a.stats().get("republish_rounds", 0) >= 1, 10, "the republish")
    assert a.stats()["republish_dropped"] >= 1
    for _ in range(5):  # never version 1 again, while the old view is still held
        n, data = get_pages(a, theirs)
        assert n == 1
        assert (data[:VALUE_LEN] == 41 % 251).all(), "owner 1 served its stale copy"
    n, data = get_pages(b, theirs)
    assert n == 1 and (data[:VALUE_LEN] == 41 % 251).all()
    old = np.zeros(VALUE_LEN, dtype=np.uint8)
    fluxon.copy_from_plan(held, old.ctypes.data, VALUE_LEN)
    assert (old == 31 % 251).all(), "the held view's bytes changed under its reader"
    a.release_views(held)
    wait_baseline(cluster, {1: a, 2: b})


def test_newer_version_wins_after_a_master_restart_whoever_republishes_first(cluster):
    """Versions issue, item 3: B deletes k and puts version 2 (acknowledged) while A, holding a
    copy of version 1, is expired; the master restarts and A republishes first. The route ends
    on version 2 (the higher hybrid-clock version), B keeps its acknowledged value, A drops its
    copy of version 1, and every reader on either owner reads version 2."""
    a, b = cluster.client(1), cluster.client(2)
    keys = ["vk-0"]
    put_pages(b, keys, seed=31)  # version 1, put on B
    n, _ = get_pages(a, keys)  # A caches a copy of version 1
    assert n == 1
    owner1, owner2 = cluster.daemons[1], cluster.daemons[2]
    os.kill(owner1.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: 1 not in cluster.owners(), 6, "owner 1 to expire")
        assert b.delete_prefix("vk-") == (1, 0)
        put_pages(b, keys, seed=41)  # version 2, acknowledged
        n, data = get_pages(b, keys)
        assert n == 1 and (data[:VALUE_LEN] == 41 % 251).all()
        os.kill(owner2.proc.pid, signal.SIGSTOP)  # B republishes only after A
        cluster.master.proc.send_signal(signal.SIGKILL)
        cluster.master.proc.wait(timeout=10)
        cluster.restart_master()
    finally:
        os.kill(owner1.proc.pid, signal.SIGCONT)
    try:
        wait_until(lambda: 1 in cluster.owners(), 10, "owner 1 to register with the new master")
        wait_until(lambda: a.stats().get("republish_rounds", 0) >= 1, 10, "owner 1's republish")
    finally:
        os.kill(owner2.proc.pid, signal.SIGCONT)
    wait_until(lambda: 2 in cluster.owners(), 10, "owner 2 to register with the new master")

    def everyone_reads_version_2():
        for c in (a, b):
            n, data = get_pages(c, keys)
            if n != 1 or not (data[:VALUE_LEN] == 41 % 251).all():
                return False
        return True

    wait_until(everyone_reads_version_2, 15, "every reader to read version 2")
    assert b.stats()["republish_dropped"] == 0, "B dropped its acknowledged version 2"
    assert a.stats()["republish_dropped"] >= 1, "A kept its copy of version 1"
    for _ in range(5):
        assert everyone_reads_version_2()
    assert cluster.master_stats().get("master_replaced_routes", 0) >= 1
    wait_baseline(cluster, {1: a, 2: b})


FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # Debian's libfaketime


def test_owner_restarted_with_its_clock_an_hour_back(cluster):
    """Versions issue, item 4: owner 1 is killed and restarted with its wall clock an hour back
    (libfaketime) while owner 2 still holds copies of its values. Its puts of keys still routed
    from those copies (new bytes) never join them: the master has another identity (first
    writer wins), the put fails with KeyConflictError, and every reader keeps reading one value
    per key. Its puts of new keys get versions above every version routed before — the hybrid
    clock took in the master's answers — and are read byte-exact."""
    assert os.path.exists(FAKETIME), "libfaketime is installed by scripts/install-deps.sh"
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("ck", 8)
    put_pages(a, keys, seed=21)
    old_version = max(int(cluster.route(k)["route"]["version"]) for k in keys)
    n, _ = get_pages(b, keys)  # owner 2 holds copies
    assert n == len(keys)
    cluster.daemons[1].proc.kill()
    cluster.daemons[1].proc.wait(timeout=10)
    wait_until(lambda: 1 not in cluster.owners(), 10, "owner 1 to expire")
    cluster.start_owner(1, name="owner-1-clock-back",
                        env={"LD_PRELOAD": FAKETIME, "FAKETIME": "-3600s",
                             "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"})
    log = cluster.daemons[1].log.read_text()
    first = time.strptime(log[1:20], "%Y-%m-%d %H:%M:%S")  # spdlog's wall-clock stamp
    assert time.time() - time.mktime(first) > 3000, "the restarted owner's clock is not back"
    a = cluster.client(1)
    with pytest.raises(fluxon.KeyConflictError):
        put_pages(a, keys, seed=77)  # new bytes for keys routed from owner 2's copies
    for c in (a, b):
        n, data = get_pages(c, keys)
        assert n == len(keys)
        expect_pages(data, n, seed=21)
    fresh = keys_of("ck-new", 4)
    put_pages(a, fresh, seed=91)
    new_version = min(int(cluster.route(k)["route"]["version"]) for k in fresh)
    assert new_version > old_version, (new_version, old_version)
    n, data = get_pages(b, fresh)
    assert n == len(fresh)
    expect_pages(data, n, seed=91)
    assert cluster.master_stats().get("master_publish_identity_refused", 0) == 0
    wait_baseline(cluster, {1: a, 2: b})
