"""Remote get across real fluxond processes on loopback: a master and two owners, each with its
own config, segment, client socket, admin port and TCP data plane (design §6).

Every test asserts behaviour that breaks if the invariant it names is broken: bytes written on
owner A restored by a client of owner B (and cached there), one BatchGetStart / Done / Revoke per
batch (G8), faults at every step — lost or duplicated master answers (T1), a source killed with
kill -9, a requester killed, a source evicting what a peer reads — and every temporary counter
(prepared and pending slots, flights, handles, master in-flight gets, source pins) back to its
baseline afterwards. Every wait is bounded.
"""

import functools
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import fluxon
import kv_pages
from conftest import FLUXOND, Daemon, free_port, owner_config

FLUXONCTL = os.environ.get("FLUXONCTL", str(Path(FLUXOND).parent / "fluxonctl"))
VALUE_LEN = 256 * 1024


class Cluster:
    """A master and owners 1..n as separate fluxond processes."""

    def __init__(self, factory, tmp, owners=2, ttl_ms=60000, lease_ms=1500, grace_ms=1000,
                 remote_timeout_ms=5000, owner_extra="", master_extra=""):
        self.factory, self.tmp = factory, tmp
        self.master_port, self.master_admin = free_port(), free_port()
        self.sockdir = Path(tempfile.mkdtemp(prefix="fxc", dir="/tmp"))
        self.remote_timeout_ms, self.owner_extra = remote_timeout_ms, owner_extra
        self.master_config = f"""
role: master
log_level: info
master: {{listen_address: "127.0.0.1:{self.master_port}", owner_lease_ms: {lease_ms},
          owner_grace_ms: {grace_ms}, inflight_ttl_ms: {ttl_ms}{master_extra}}}
admin: {{listen_address: "127.0.0.1:{self.master_admin}", metrics_port: 0}}
"""
        self.master = factory(self.master_config, name="master")
        self.admin = {}
        self.daemons = {}
        for node in range(1, owners + 1):
            self.start_owner(node)

    def sock(self, node):
        return str(self.sockdir / f"owner-{node}.sock")

    def restart_master(self):
        """A new master process on the same port and config (the old one must be gone)."""
        self.master = self.factory(self.master_config, name=f"master-{time.time_ns()}")
        return self.master

    def start_owner(self, node, name=None, env=None):
        self.admin[node] = free_port()
        d = self.factory(owner_config(node, self.admin[node], f"127.0.0.1:{self.master_port}",
                                      self.sock(node), self.remote_timeout_ms, f"""\
  local_reserve: {{claim_soft_timeout_ms: 5, claim_hard_timeout_ms: 1000}}
  transports: [tcp]
  eviction_interval_ms: 10
{self.owner_extra}"""), name=name or f"owner-{node}", env=env)
        self.daemons[node] = d
        return d

    def client(self, node):
        return fluxon.KvClient(socket_path=self.sock(node))

    def ctl(self, admin_port, *args, check=True):
        r = subprocess.run([FLUXONCTL, "--admin", f"127.0.0.1:{admin_port}", "--json", *args],
                           capture_output=True, text=True, timeout=20)
        if check:
            assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout) if r.stdout.strip().startswith(("{", "[")) else r.stdout

    def fault(self, node, point, action, delay_ms=0, count=-1):
        self.ctl(self.admin[node], "fault", "set", point, action, "--delay-ms", str(delay_ms),
                 "--count", str(count))

    def master_stats(self):
        return self.ctl(self.master_admin, "stats")

    def owners(self):
        return {o["node_id"]: o for o in self.ctl(self.master_admin, "owners")["owners"]}

    def route(self, key):
        return self.ctl(self.master_admin, "route", key)


def wait_pins(cluster, node, n, timeout=5.0):
    """Until the master shows `n` source pins on `node` (a peer's read is about to happen)."""
    deadline = time.time() + timeout
    while cluster.owners()[node].get("source_pins", 0) != n:
        assert time.time() < deadline, f"node {node} never had {n} pinned values"
        time.sleep(0.02)


def keys_of(tag, n):
    return [f"{tag}-{i}" for i in range(n)]


put_pages = functools.partial(kv_pages.put_pages, value_len=VALUE_LEN)
get_pages = functools.partial(kv_pages.get_pages, value_len=VALUE_LEN)


def put_behind_a_slow_read(cluster, tag, n, seed):
    """Clients of owners 1 and 2, `n` pages put on owner 1, and owner 2's next peer read held back
    3 s; returns (client 1, client 2, the keys)."""
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of(tag, n)
    put_pages(a, keys, seed=seed)
    cluster.fault(2, "peer.read", "delay", delay_ms=3000, count=1)
    return a, b, keys


def expect_pages(data, n, seed):
    for i in range(n):
        page = data[i * VALUE_LEN:(i + 1) * VALUE_LEN]
        assert (page == (seed + i) % 251).all(), f"page {i} has the wrong bytes"


TEMPORARY = ("slots_Prepared", "slots_Pending", "inflight_gets", "live_handles", "live_views",
             "prepared_puts", "reserved_entries", "remote_pending_targets",
             "remote_quarantined_slots", "remote_unfinished", "write_through_puts",
             "demoting_bytes")


def wait_baseline(cluster, clients, timeout=15.0):
    """Every process's temporary state back to baseline, within a bound."""
    deadline = time.time() + timeout
    while True:
        bad = {}
        for node, c in clients.items():
            s = c.stats()
            for k in TEMPORARY:
                if s.get(k, 0) != 0:
                    bad[f"owner{node}.{k}"] = s[k]
        m = cluster.master_stats()
        if m.get("master_inflight_gets", 0) != 0:
            bad["master_inflight_gets"] = m["master_inflight_gets"]
        for node, o in cluster.owners().items():
            if o.get("source_pins", 0) or o.get("inflight_gets", 0):
                bad[f"master.owner{node}.pins"] = (o.get("source_pins"), o.get("inflight_gets"))
        if not bad:
            return
        assert time.time() < deadline, f"not back to baseline: {bad}"
        time.sleep(0.1)


@pytest.fixture
def cluster(daemon_factory, tmp):
    return Cluster(daemon_factory, tmp)


def test_a_page_written_on_owner_a_is_restored_on_owner_b_and_cached_there(cluster):
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("basic", 16)
    put_pages(a, keys, seed=7)
    t, data = get_pages(b, keys)
    assert t == 16
    expect_pages(data, 16, seed=7)
    s = b.stats()
    assert s["remote_hits"] == 16 and s["remote_bytes"] == 16 * VALUE_LEN
    assert s["remote_get_batches"] == 1 and s["remote_get_done_calls"] == 1
    assert s["remote_transfer_submissions"] == 1  # one read for the one source peer
    # The copy is another location of the same version, and a local hit on B from now on.
    route = cluster.route(keys[0])
    nodes = sorted(l["node_id"] for l in route["route"]["locations"])
    assert nodes == [1, 2]
    assert len({l["put_id"] for l in route["route"]["locations"]}) == 1
    t, data = get_pages(b, keys)
    assert t == 16
    expect_pages(data, 16, seed=7)
    s2 = b.stats()
    assert s2["remote_get_batches"] == 1 and s2["local_pinned"] >= 16
    owners = cluster.owners()
    assert owners[1]["address"] and owners[1]["transports"] == ["tcp"]
    assert owners[1]["lease_ms_left"] > 0
    # A heard of B's read with its next heartbeat (1 s): an access of the 16 values in its hot
    # tier, once (B's later local hits never reach the master).
    deadline = time.time() + 10
    while a.stats()["peer_read_touches"] < 16 and time.time() < deadline:
        time.sleep(0.1)
    assert a.stats()["peer_read_touches"] == 16
    assert cluster.master_stats()["master_peer_read_keys"] == 16
    assert b.stats()["peer_read_touches"] == 0
    wait_baseline(cluster, {1: a, 2: b})


def test_a_master_keeping_key_fingerprints_only_routes_the_same_and_refuses_to_list(
        daemon_factory, tmp):
    """master.route_keys: fingerprint — the master holds a keyed 128-bit hash of each key, not
    its bytes: remote gets, copies and a master restart (republish, under a new secret) behave as
    with full keys; a key that was never put misses; listing keys is refused with the reason."""
    cluster = Cluster(daemon_factory, tmp, master_extra=", route_keys: fingerprint")
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("fp", 24)
    put_pages(a, keys, seed=11)
    t, data = get_pages(b, keys[:12])
    assert t == 12
    expect_pages(data, 12, seed=11)
    assert sorted(l["node_id"] for l in cluster.route(keys[3])["route"]["locations"]) == [1, 2]
    assert [l["node_id"] for l in cluster.route(keys[20])["route"]["locations"]] == [1]
    assert get_pages(b, ["fp-never-put"])[0] == 0
    assert cluster.master_stats()["master_routes"] == 24
    r = subprocess.run([FLUXONCTL, "--admin", f"127.0.0.1:{cluster.master_admin}", "keys"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0
    assert "route_keys: fingerprint" in r.stdout + r.stderr
    # A restarted master (a new secret) is filled again by the owners' republish: B reads the
    # half it never read from A through the new master's routes.
    cluster.master.stop()
    cluster.restart_master()
    # Each owner republishes on its own: the routes come back with A's, B's copies with B's.
    deadline = time.time() + 20
    while (cluster.master_stats().get("master_routes", 0) < 24 or
           sorted(l["node_id"] for l in cluster.route(keys[3]).get("route", {}).get(
               "locations", [])) != [1, 2]):
        assert time.time() < deadline, "the owners did not republish into the new master"
        time.sleep(0.1)
    t, data = get_pages(b, keys[12:])
    assert t == 12
    expect_pages(data, 12, seed=11 + 12)
    wait_baseline(cluster, {1: a, 2: b})


def test_control_calls_grow_with_batches_not_keys(cluster):  # G8
    a, b = cluster.client(1), cluster.client(2)
    for batch in range(3):
        keys = keys_of(f"g8-{batch}", 32)
        put_pages(a, keys, seed=batch)
        t, data = get_pages(b, keys)
        assert t == 32
        expect_pages(data, 32, seed=batch)
    s = b.stats()
    assert s["remote_get_keys"] == 96
    assert s["remote_get_batches"] == 3
    assert s["remote_get_done_calls"] == 3
    assert s["remote_transfer_submissions"] == 3
    m = cluster.master_stats()
    assert m["master_get_start_calls"] == 3 and m["master_get_start_items"] == 96
    assert m["master_get_done_calls"] == 3 and m["master_gets_done"] == 96
    wait_baseline(cluster, {1: a, 2: b})


def test_mixed_batch_of_local_and_remote_pages_keeps_the_order(cluster):  # G4
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("mixed", 8)
    put_pages(b, keys[:4], seed=0)       # pages 0..3 on B itself
    put_pages(a, keys[4:], seed=4)       # pages 4..7 on A
    t, data = get_pages(b, keys)
    assert t == 8
    expect_pages(data, 8, seed=0)
    s = b.stats()
    assert s["remote_hits"] == 4 and s["remote_get_keys"] == 4
    # A page nobody has ends the prefix, and nothing past it is fetched (G5).
    more = keys_of("mixed2", 6)
    put_pages(a, more[:2] + more[3:], seed=0)
    before = b.stats()["remote_get_keys"]
    h = b.get_start(more)
    assert h.result.transferable_len == 2
    b.cancel_get_transfer(h)
    assert b.stats()["remote_get_keys"] - before == 2
    wait_baseline(cluster, {1: a, 2: b})


def test_source_killed_mid_transfer_ends_as_misses_in_bounded_time(cluster):
    a, b, keys = put_behind_a_slow_read(cluster, "kill", 16, seed=1)
    result = {}

    def get():
        t0 = time.time()
        result["t"], _ = get_pages(b, keys)
        result["secs"] = time.time() - t0

    th = threading.Thread(target=get)
    th.start()
    wait_pins(cluster, 1, 16)  # B holds the pinned gets and is about to read
    cluster.daemons[1].proc.send_signal(signal.SIGKILL)
    cluster.daemons[1].proc.wait(timeout=10)
    th.join(timeout=20)
    assert not th.is_alive(), "the get hung after its source died"
    assert result["t"] == 0
    assert result["secs"] < 10
    s = b.stats()
    assert s["remote_transfer_failures"] >= 1 and s["remote_misses"] >= 16
    assert s["remote_get_revoke_calls"] >= 1
    wait_baseline(cluster, {2: b})
    # Once A's lease and grace pass, its routes are gone: a clear miss, no bytes served.
    deadline = time.time() + 15
    while cluster.route(keys[0])["found"]:
        assert time.time() < deadline, "a dead owner's routes were never dropped"
        time.sleep(0.2)
    assert get_pages(b, keys)[0] == 0


def test_lost_batch_get_start_answer_quarantines_targets_until_the_ttl(daemon_factory, tmp):
    cluster = Cluster(daemon_factory, tmp, ttl_ms=1500, remote_timeout_ms=1000)
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("lost-start", 8)
    put_pages(a, keys, seed=3)
    cluster.fault(2, "master.BatchGetStart", "drop")  # applied, every answer lost
    t0 = time.time()
    assert get_pages(b, keys)[0] == 0
    assert time.time() - t0 < 5
    s = b.stats()
    assert s["remote_start_lost"] == 1
    assert s["remote_quarantined_slots"] == 8 and s["slots_Prepared"] == 8  # not reused early
    time.sleep(0.5)
    assert b.stats()["slots_Prepared"] == 8  # still inside TTL + margin
    cluster.ctl(cluster.admin[2], "fault", "clear")
    wait_baseline(cluster, {1: a, 2: b}, timeout=10)  # freed after the TTL, master entries gone
    t, data = get_pages(b, keys)
    assert t == 8
    expect_pages(data, 8, seed=3)


def test_one_lost_start_answer_is_resolved_by_the_retry_with_the_same_request_id(cluster):  # T1
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("replay", 8)
    put_pages(a, keys, seed=5)
    cluster.fault(2, "master.BatchGetStart", "drop", count=1)
    t, data = get_pages(b, keys)
    assert t == 8
    expect_pages(data, 8, seed=5)
    m = cluster.master_stats()
    assert m["master_get_start_replayed"] == 1 and m["master_gets_started"] == 8
    assert b.stats()["remote_quarantined_slots"] == 0
    wait_baseline(cluster, {1: a, 2: b})


@pytest.mark.parametrize("action", ["drop", "duplicate"])
def test_lost_or_duplicated_done_converges_to_one_copy(cluster, action):  # T1, T2
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of(f"done-{action}", 8)
    put_pages(a, keys, seed=9)
    cluster.fault(2, "master.BatchGetDone", action, count=1)
    t, data = get_pages(b, keys)
    assert t == 8
    expect_pages(data, 8, seed=9)
    for k in keys:
        locs = cluster.route(k)["route"]["locations"]
        assert sorted(l["node_id"] for l in locs) == [1, 2]
    m = cluster.master_stats()
    assert m["master_gets_done"] == 8  # one copy per key, however often Done arrived
    assert m["master_get_done_calls"] == 2
    assert m["master_get_done_replayed"] == 8
    wait_baseline(cluster, {1: a, 2: b})


def test_failed_read_with_lost_revoke_answers_frees_targets_after_the_retry(cluster):  # T1
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("revoke", 8)
    put_pages(a, keys, seed=2)
    cluster.fault(2, "peer.read", "fail", count=1)
    cluster.fault(2, "master.BatchGetRevoke", "drop", count=2)
    assert get_pages(b, keys)[0] == 0
    s = b.stats()
    assert s["remote_get_revoke_calls"] >= 3 and s["remote_transfer_failures"] == 1
    m = cluster.master_stats()
    assert m["master_gets_revoked"] == 8
    wait_baseline(cluster, {1: a, 2: b})
    t, data = get_pages(b, keys)  # nothing was left BUSY at the master
    assert t == 8
    expect_pages(data, 8, seed=2)


def test_source_eviction_keeps_a_value_a_peer_is_reading(cluster):
    a, b, keys = put_behind_a_slow_read(cluster, "pinned", 8, seed=4)
    result = {}
    th = threading.Thread(target=lambda: result.update(got=get_pages(b, keys)))
    th.start()
    wait_pins(cluster, 1, 8)
    deleted, kept = a.delete_prefix("pinned-")
    assert deleted == 0 and kept == 8  # the master refused to remove pinned locations
    assert a.stats()["eviction_skipped_source_pinned"] == 8
    th.join(timeout=20)
    t, data = result["got"]
    assert t == 8
    expect_pages(data, 8, seed=4)  # the bytes were never freed under the read
    deleted, kept = a.delete_prefix("pinned-")
    assert deleted == 8 and kept == 0
    wait_baseline(cluster, {1: a, 2: b})


def test_requester_killed_its_gets_expire_and_the_source_pins_go(daemon_factory, tmp):
    cluster = Cluster(daemon_factory, tmp, ttl_ms=3000, lease_ms=800, grace_ms=400)
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("requester", 8)
    put_pages(a, keys, seed=6)
    cluster.fault(2, "peer.read", "delay", delay_ms=30000, count=1)
    th = threading.Thread(target=lambda: pytest.raises(Exception, get_pages, b, keys))
    th.daemon = True
    th.start()
    wait_pins(cluster, 1, 8)
    assert cluster.owners()[2]["inflight_gets"] == 8
    cluster.daemons[2].proc.send_signal(signal.SIGKILL)
    cluster.daemons[2].proc.wait(timeout=10)
    deadline = time.time() + 10
    while True:
        o = cluster.owners()
        if o.get(1, {}).get("source_pins", 0) == 0 and 2 not in o:
            break
        assert time.time() < deadline, f"pins of a dead requester stayed: {o}"
        time.sleep(0.1)
    assert cluster.master_stats()["master_inflight_gets"] == 0
    deleted, kept = a.delete_prefix("requester-")
    assert deleted == 8 and kept == 0


def test_restarted_source_is_a_new_generation_and_its_old_routes_serve_nothing(cluster):
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("restart", 4)
    put_pages(a, keys, seed=8)
    cluster.daemons[1].proc.send_signal(signal.SIGKILL)
    cluster.daemons[1].proc.wait(timeout=10)
    cluster.start_owner(1, name="owner-1b")  # waits out the lease, registers a new generation
    assert not cluster.route(keys[0])["found"]
    assert get_pages(b, keys)[0] == 0
    a2 = cluster.client(1)
    put_pages(a2, keys, seed=100)
    t, data = get_pages(b, keys)
    assert t == 4
    expect_pages(data, 4, seed=100)
    wait_baseline(cluster, {1: a2, 2: b})


def test_a_deferred_get_start_answers_before_the_read_and_the_transfer_brings_the_bytes(cluster):
    """allow_deferred: owner B answers get_start before it has read A's values (the prefix
    counts them), get_transfer waits for them; the bytes are A's, and what is left is B's copy."""
    a, b, keys = put_behind_a_slow_read(cluster, "dfr", 16, seed=3)  # B's next read waits 3 s
    t0 = time.time()
    # transfer=True does not make a deferred answer wait: the transfer stays its own call.
    h = b.get_start(keys, allow_deferred=True, transfer=True)
    started = time.time() - t0
    assert h.result.deferred and h.result.transferable_len == 16, h.result
    assert not h.result.transferred
    assert started < 2.0, started
    plan = b.get_transfer(h)
    assert time.time() - t0 >= 2.5
    out = np.zeros(16 * VALUE_LEN, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, VALUE_LEN)
    b.release_views(plan)
    expect_pages(out, 16, seed=3)
    s = b.stats()
    assert s["deferred_gets"] == 1 and s["deferred_gets_failed"] == 0, s
    # B's copies serve the next get locally, with the offsets in the answer.
    h = b.get_start(keys, allow_deferred=True)
    assert not h.result.deferred and h.result.local_pinned == 16
    b.cancel_get_transfer(h)
    h = b.get_start(keys, allow_deferred=True, transfer=True)
    assert not h.result.deferred and h.result.transferred
    b.release_views(b.get_transfer(h))
    wait_baseline(cluster, {1: a, 2: b})


def test_a_deferred_value_whose_source_died_fails_the_transfer_and_leaves_nothing(cluster):
    """The source killed while B reads: the deferred transfer fails (FetchFailedError) within the
    remote-get bound, the handle is released, and B's temporary state returns to baseline."""
    a, b, keys = put_behind_a_slow_read(cluster, "dfk", 8, seed=5)
    h = b.get_start(keys, allow_deferred=True)
    assert h.result.deferred and h.result.transferable_len == 8
    wait_pins(cluster, 1, 8)
    cluster.daemons[1].proc.send_signal(signal.SIGKILL)
    cluster.daemons[1].proc.wait(timeout=10)
    t0 = time.time()
    with pytest.raises(fluxon.FetchFailedError):
        b.get_transfer(h)
    assert time.time() - t0 < 10
    with pytest.raises(fluxon.NotFoundError):
        b.cancel_get_transfer(h)
    s = b.stats()
    assert s["deferred_gets_failed"] == 1 and s["live_handles"] == 0, s
    wait_baseline(cluster, {2: b})


def test_a_deferred_mixed_batch_keeps_the_order_and_a_shorter_consumed_prefix(cluster):
    """Local pages first, then A's: the deferred plan keeps the caller's order (G4), a consumed
    prefix that ends inside the remote part names only those pages, and a miss still ends the
    prefix with nothing past it fetched (G5)."""
    a, b = cluster.client(1), cluster.client(2)
    keys = keys_of("dmix", 8)
    put_pages(b, keys[:4], seed=0)
    put_pages(a, keys[4:], seed=4)
    h = b.get_start(keys, allow_deferred=True)
    assert h.result.deferred and h.result.transferable_len == 8
    assert h.result.local_pinned == 4 and h.result.leader_started == 4
    plan = b.get_transfer(h, consume_prefix_len=6)
    out = np.zeros(6 * VALUE_LEN, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, VALUE_LEN)
    b.release_views(plan)
    expect_pages(out, 6, seed=0)
    more = keys_of("dmix2", 6)
    put_pages(a, more[:2] + more[3:], seed=0)
    before = b.stats()["remote_get_keys"]
    h = b.get_start(more, allow_deferred=True)
    assert h.result.transferable_len == 2
    b.cancel_get_transfer(h)
    wait_baseline(cluster, {1: a, 2: b})
    assert b.stats()["remote_get_keys"] - before == 2


@pytest.mark.parametrize("deferred", [True, False])
def test_hicache_exists_counts_another_owners_pages_and_the_get_brings_their_bytes(cluster,
                                                                                  deferred):
    """The HiCache backend's existence check on owner B of pages owner A holds: deferred (the
    default), it answers before B's read of them (held back 3 s) and the get that follows waits
    for that one fetch; not deferred, the check itself waits for the read. Either way every page
    counts, the get brings A's bytes, B reads them once, and nothing temporary is left."""
    from fluxon.hicache import PageStore

    a, b, keys = put_behind_a_slow_read(cluster, f"hx{int(deferred)}", 16, seed=5)
    store = PageStore(cluster.sock(2), deferred_exists=deferred)
    t0 = time.time()
    assert store.exists_prefix(keys) == 16
    checked = time.time() - t0
    if deferred:
        assert checked < 2.0, checked
    else:
        assert checked >= 2.5, checked
    out = np.zeros(16 * VALUE_LEN, dtype=np.uint8)
    ptrs = [int(out.ctypes.data) + i * VALUE_LEN for i in range(16)]
    assert store.get_pages(keys, ptrs, [VALUE_LEN] * 16, 1, VALUE_LEN) == [True] * 16
    assert time.time() - t0 >= 2.5  # the bytes came through the held-back read
    expect_pages(out, 16, seed=5)
    s = b.stats()
    assert s["remote_get_batches"] == 1 and s["remote_hits"] == 16, s
    assert s["deferred_gets"] == (1 if deferred else 0), s
    wait_baseline(cluster, {1: a, 2: b})
