"""The fluxon Python client against a real fluxond: contract names, round trips, errors,
futures, prefixes, and several client processes on one segment."""

import ctypes
import functools
import inspect
import multiprocessing as mp
import time

import numpy as np
import pytest

import fluxon
import kv_pages
from conftest import embedded_config, free_port

VALUE_LEN = 64 * 1024


def put(client, keys, value_len=VALUE_LEN, opts=None, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, size=(len(keys), value_len), dtype=np.uint8)
    plan = client.local_fast_put_start(keys, value_len, opts)
    fluxon.copy_to_plan(plan, data.ctypes.data, value_len)
    fut = client.local_fast_put_commit(plan)
    fut.wait(timeout=10)
    return data


read = functools.partial(kv_pages.read_hit, value_len=VALUE_LEN)


BASELINE_ZERO = ("live_handles", "live_views", "prepared_puts", "reserved_entries",
                 "inflight_gets", "slots_Prepared", "slots_PendingLocalVisible", "slots_Releasing",
                 "publish_queue", "client_active_plans", "client_handles",
                 "client_pending_futures")


def assert_baseline(client, timeout=10.0):
    """Every temporary counter back to zero, waited for as a whole (releases finish on the
    owner's threads after the call that caused them returned) within a bound."""
    deadline = time.monotonic() + timeout
    while True:
        s = client.stats()
        gaps = {k: s[k] for k in BASELINE_ZERO if s[k] != 0}
        if not gaps or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not gaps, gaps


def test_public_names_match_the_contract():
    sig = inspect.signature(fluxon.KvClient.__init__)
    assert list(sig.parameters)[1:] == ["socket_path", "config_path"]
    assert sig.parameters["socket_path"].default is None
    a = fluxon.PutOptionalArgs()
    assert (a.reject_if_inflight_same_key, a.reject_if_exist_same_key, a.write_through,
            a.make_replica_task, a.make_replica_task_mask, a.atomic_group_lens,
            a.lease_id) == (True, True, False, False, None, None, None)
    gs = inspect.signature(fluxon.KvClient.get_start)
    assert gs.parameters["prefix_best_effort"].default is True
    assert gs.parameters["atomic_group_lens"].default is None
    gt = inspect.signature(fluxon.KvClient.get_transfer)
    assert gt.parameters["consume_prefix_len"].kind is inspect.Parameter.KEYWORD_ONLY
    for name in ("wait_local_segments_ready", "local_fast_put_start", "local_fast_put_commit",
                 "put_abort", "get_start", "get_transfer", "cancel_get_transfer",
                 "release_views", "stats"):
        assert callable(getattr(fluxon.KvClient, name))
    assert issubclass(fluxon.InvalidArgumentError, ValueError)
    assert issubclass(fluxon.InvalidArgumentError, fluxon.FluxonError)
    assert issubclass(fluxon.KeyConflictError, fluxon.FluxonError)
    assert issubclass(fluxon.NoSpaceError, fluxon.FluxonError)
    assert issubclass(fluxon.TimeoutError, TimeoutError)
    for f in ("raw_prefix_hit_len", "transferable_len", "prefix_hit_groups", "first_miss_index",
              "first_miss_group_index", "all_hit"):
        assert f in fluxon.GetStartResult.__dataclass_fields__


def test_segments_are_reported_for_registration(client):
    segs = client.wait_local_segments_ready()
    assert len(segs) == 1
    s = segs[0]
    assert set(s) >= {"segment_label", "write_ptr", "read_ptr", "len", "generation", "node_id"}
    assert s["segment_label"] == "external_owner:0"
    assert s["len"] > 1 << 30 and s["generation"] != 0 and s["write_ptr"] % 4096 == 0


def test_round_trip_and_plan_blob_layout(client):
    keys = [f"rt{i}" for i in range(16)]
    plan = client.local_fast_put_start(keys, VALUE_LEN)
    words = (ctypes.c_uint64 * (2 + len(keys))).from_address(plan)
    assert words[0] == fluxon.PLAN_BLOB_MAGIC and words[1] == len(keys)
    assert list(words[2:]) == fluxon.plan_value_ptrs(plan)
    client.put_abort(plan)
    data = put(client, keys)
    assert np.array_equal(read(client, keys), data)
    assert_baseline(client)


def test_conflicts_raise_with_indices_and_reserve_nothing(client):
    plan = client.local_fast_put_start(["a", "b"], VALUE_LEN)
    with pytest.raises(fluxon.KeyConflictError) as e:
        client.local_fast_put_start(["c", "b", "d"], VALUE_LEN)
    assert e.value.conflict_indices == [1]
    # "c" and "d" were not reserved: they can be written now.
    put(client, ["c", "d"])
    client.put_abort(plan)
    put(client, ["a", "b"])
    with pytest.raises(fluxon.KeyConflictError) as e:
        client.local_fast_put_start(["x", "a"], VALUE_LEN)
    assert e.value.conflict_indices == [1]
    assert_baseline(client)


@pytest.mark.parametrize("call", [
    lambda c: c.local_fast_put_start([], VALUE_LEN),
    lambda c: c.local_fast_put_start("abc", VALUE_LEN),
    lambda c: c.local_fast_put_start(["k", 3], VALUE_LEN),
    lambda c: c.local_fast_put_start(["k", "k"], VALUE_LEN),
    lambda c: c.local_fast_put_start([""], VALUE_LEN),
    lambda c: c.local_fast_put_start(["k"], 0),
    lambda c: c.local_fast_put_start(["k"], -1),
    lambda c: c.local_fast_put_start(["k"], 1.5),
    lambda c: c.local_fast_put_start(["k"], 513 * 1024 * 1024),
    lambda c: c.local_fast_put_start(["k1", "k2"], VALUE_LEN,
                                     fluxon.PutOptionalArgs(atomic_group_lens=[1, 2])),
    lambda c: c.local_fast_put_start(["k1", "k2"], VALUE_LEN,
                                     fluxon.PutOptionalArgs(atomic_group_lens=[0, 2])),
    lambda c: c.local_fast_put_start(["k1", "k2"], VALUE_LEN,
                                     fluxon.PutOptionalArgs(atomic_group_lens=[2.0])),
    lambda c: c.local_fast_put_start(["k1", "k2"], VALUE_LEN,
                                     fluxon.PutOptionalArgs(make_replica_task_mask=[True])),
    lambda c: c.local_fast_put_start(["k1", "k2"], VALUE_LEN, fluxon.PutOptionalArgs(
        make_replica_task_mask=[True, False], atomic_group_lens=[2])),
    lambda c: c.local_fast_put_start(["k1"], VALUE_LEN, {"write_through": False}),
    lambda c: c.get_start([]),
    lambda c: c.get_start(["a", "b"], atomic_group_lens=[3]),
    lambda c: c.get_start(["a", "b"], atomic_group_lens=[-1, 3]),
])
def test_bad_inputs_raise_invalid_argument_and_leave_nothing(client, call):
    with pytest.raises(fluxon.InvalidArgumentError):
        call(client)
    assert_baseline(client)
    assert client.stats()["keys"] == 0


@pytest.mark.parametrize("opts, option", [
    (fluxon.PutOptionalArgs(reject_if_inflight_same_key=False), "reject_if_inflight_same_key"),
    (fluxon.PutOptionalArgs(reject_if_exist_same_key=False), "reject_if_exist_same_key"),
    (fluxon.PutOptionalArgs(write_through=True), "write_through"),
    (fluxon.PutOptionalArgs(lease_id="lease-7"), "lease_id"),
])
def test_options_not_implemented_are_refused_not_ignored(client, opts, option):
    """An option Fluxon does not implement yet (write-through, leases) or whose other
    value it does not support (the reject_if_* flags are always on) is an InvalidArgumentError
    naming it — never a success that silently does less — and reserves nothing."""
    with pytest.raises(fluxon.InvalidArgumentError, match=option):
        client.local_fast_put_start(["o1", "o2"], VALUE_LEN, opts)
    assert_baseline(client)
    assert client.stats()["keys"] == 0
    # All defaults, an all-False mask and replicas asked for are fine (replicas are made off
    # the put's path; a single node has no target, which the owner counts as NoSpace).
    plan = client.local_fast_put_start(["o1", "o2"], VALUE_LEN, fluxon.PutOptionalArgs(
        make_replica_task_mask=[False, False]))
    client.put_abort(plan)
    plan = client.local_fast_put_start(["o1", "o2"], VALUE_LEN, fluxon.PutOptionalArgs(
        make_replica_task=True, make_replica_task_mask=[False, True]))
    client.put_abort(plan)


def test_plans_and_handles_are_typed_and_single_use(client):
    put(client, ["p0", "p1", "p2", "p3"])
    putplan = client.local_fast_put_start(["q"], VALUE_LEN)
    with pytest.raises(fluxon.InvalidArgumentError):
        client.release_views(putplan)  # a put plan is not a get plan
    h = client.get_start(["p0", "p1", "p2", "p3"], atomic_group_lens=[2, 2])
    for bad in (0, 1, 3, 5, -2):
        with pytest.raises(fluxon.InvalidArgumentError):
            client.get_transfer(h, consume_prefix_len=bad)
    getplan = client.get_transfer(h, consume_prefix_len=2)  # still usable after bad calls
    assert len(fluxon.plan_value_ptrs(getplan)) == 2
    with pytest.raises(fluxon.NotFoundError):
        client.get_transfer(h)  # consumed
    with pytest.raises(fluxon.NotFoundError):
        client.cancel_get_transfer(h)
    with pytest.raises(fluxon.InvalidArgumentError):
        client.local_fast_put_commit(getplan)
    client.release_views(getplan)
    with pytest.raises(fluxon.PlanStateError):
        client.release_views(getplan)  # twice
    client.put_abort(putplan)
    with pytest.raises(fluxon.PlanStateError):
        client.local_fast_put_commit(putplan)
    with pytest.raises(fluxon.NotFoundError):
        client.release_views(123456)
    with pytest.raises(fluxon.InvalidArgumentError):
        client.get_transfer("not a handle")
    assert_baseline(client)


def test_prefix_and_groups(client):
    keys = [f"g{i}" for i in range(6)]
    put(client, [keys[0], keys[1], keys[2], keys[4]])
    h = client.get_start(keys, atomic_group_lens=[2, 2, 2])
    r = h.result
    assert (r.raw_prefix_hit_len, r.transferable_len, r.prefix_hit_groups) == (3, 2, 1)
    assert (r.first_miss_index, r.first_miss_group_index, r.all_hit) == (3, 1, False)
    client.cancel_get_transfer(h)
    full = client.get_start(keys[:2])
    assert full.result.all_hit and full.result.first_miss_index is None
    assert full.result.first_miss_group_index is None
    client.cancel_get_transfer(full)
    assert_baseline(client)


def test_get_start_with_transfer_opens_the_views_in_the_same_round_trip(client):
    keys = [f"gt{i}" for i in range(8)]
    data = put(client, keys, seed=3)
    # The whole prefix, transferred by get_start: views open, no handle left to transfer.
    h = client.get_start(keys, transfer=True)
    assert h.result.all_hit and h.result.transferred
    s = client.stats()
    assert (s["live_handles"], s["live_views"]) == (0, 1), s
    plan = client.get_transfer(h)
    out = np.empty((len(keys), VALUE_LEN), dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, VALUE_LEN)
    assert np.array_equal(out, data)
    with pytest.raises(fluxon.FluxonError):
        client.get_transfer(h)  # a handle is consumed once, transferred or not
    client.release_views(plan)
    assert_baseline(client)

    # A shorter consumed prefix: its plan covers it, release_views ends every view.
    h = client.get_start(keys, transfer=True)
    plan = client.get_transfer(h, consume_prefix_len=3)
    assert len(fluxon.plan_value_ptrs(plan)) == 3
    client.release_views(plan)
    assert_baseline(client)

    # Cancelled: the views get_start opened are released.
    h = client.get_start(keys, transfer=True)
    client.cancel_get_transfer(h)
    assert_baseline(client)

    # A partial hit transfers its prefix; nothing found transfers nothing.
    h = client.get_start(keys[:2] + ["gt-missing"] + keys[2:], transfer=True)
    assert (h.result.transferable_len, h.result.transferred) == (2, True)
    plan = client.get_transfer(h)
    assert len(fluxon.plan_value_ptrs(plan)) == 2
    client.release_views(plan)
    h = client.get_start(["gt-missing"], transfer=True)
    assert (h.result.transferable_len, h.result.transferred) == (0, False)
    client.cancel_get_transfer(h)
    # Without it nothing changes: the handle waits for get_transfer.
    h = client.get_start(keys)
    assert not h.result.transferred
    assert client.stats()["live_handles"] == 1
    client.cancel_get_transfer(h)
    with pytest.raises(fluxon.InvalidArgumentError):
        client.get_start(keys, transfer="yes")
    assert_baseline(client)


def test_a_transferred_handle_past_its_view_lease_issues_no_plan(daemon_factory, sock):
    daemon_factory(embedded_config(sock, extra_owner="  view_lease_ms: 300"))
    c = fluxon.KvClient(socket_path=sock)
    put(c, ["vl0", "vl1"])
    h = c.get_start(["vl0", "vl1"], transfer=True)
    assert h.result.transferred
    time.sleep(0.5)
    with pytest.raises(fluxon.TimeoutError):
        c.get_transfer(h)
    with pytest.raises(fluxon.FluxonError):
        c.get_transfer(h)  # consumed by the refusal
    # In time it works.
    h = c.get_start(["vl0", "vl1"], transfer=True)
    c.release_views(c.get_transfer(h))
    assert_baseline(c)


def test_future_completes_after_delayed_publish(daemon_factory, sock):
    extra = """faults:
  - {point: master.PublishBatch, action: delay, delay_ms: 500, count: 1}"""
    daemon_factory(embedded_config(sock, extra=extra))
    c = fluxon.KvClient(socket_path=sock)
    plan = c.local_fast_put_start(["v1"], VALUE_LEN)
    fut = c.local_fast_put_commit(plan)
    h = c.get_start(["v1"])  # V1: readable before the publish
    assert h.result.all_hit
    assert not fut.done()
    with pytest.raises(fluxon.TimeoutError):
        fut.wait(timeout=0.05)
    with pytest.raises(TimeoutError):
        fut.wait(timeout=0.0)
    fut.wait(timeout=5)
    assert fut.done() and fut.exception() is None
    c.cancel_get_transfer(h)
    assert_baseline(c)


def test_delete_prefix_waits_for_the_publish_of_a_put_just_made(daemon_factory, sock):
    # The put's route reaches the master 500 ms after the commit; a delete right after the
    # commit still deletes the value (it waits for the publish) instead of keeping it.
    extra = """faults:
  - {point: master.PublishBatch, action: delay, delay_ms: 500, count: 1}"""
    daemon_factory(embedded_config(sock, extra=extra))
    c = fluxon.KvClient(socket_path=sock)
    fut = c.local_fast_put_commit(c.local_fast_put_start(["dp-0", "dp-1"], VALUE_LEN))
    assert not fut.done()
    t0 = time.time()
    assert c.delete_prefix("dp-") == (2, 0)
    assert 0.2 < time.time() - t0 < 5
    fut.wait(timeout=5)
    h = c.get_start(["dp-0", "dp-1"])
    assert h.result.raw_prefix_hit_len == 0
    c.cancel_get_transfer(h)
    assert_baseline(c)


def test_no_space_error_after_bounded_wait(daemon_factory, sock):
    daemon_factory(embedded_config(sock, size="512MiB"))
    c = fluxon.KvClient(socket_path=sock)
    plans = c.local_fast_put_start([f"big{i}" for i in range(4)], 128 * 1024 * 1024)
    t0 = time.time()
    with pytest.raises(fluxon.NoSpaceError):
        c.local_fast_put_start(["one-more"], 128 * 1024 * 1024)
    assert time.time() - t0 < 5
    c.put_abort(plans)
    assert_baseline(c)


def test_config_path_and_unreachable_owner(daemon, sock, tmp):
    cfg = tmp / "client.yaml"
    cfg.write_text(f"role: client\nclient: {{socket_path: {sock}}}\n")
    c = fluxon.KvClient(config_path=str(cfg))
    assert c.socket_path == sock
    with pytest.raises(fluxon.OwnerUnavailableError):
        fluxon.KvClient(socket_path=sock + ".missing")


def test_daemon_restart_turns_into_unavailable_errors(daemon_factory, sock):
    d = daemon_factory(embedded_config(sock))
    c = fluxon.KvClient(socket_path=sock)
    put(c, ["r0"])
    plan = c.local_fast_put_start(["r1"], VALUE_LEN)
    d.stop()
    with pytest.raises(fluxon.FluxonError):
        c.local_fast_put_commit(plan)
    with pytest.raises(fluxon.OwnerUnavailableError):
        c.get_start(["r0"])


def _child_reader(sock, keys, expected_sum, q):
    import fluxon as fx
    c = fx.KvClient(socket_path=sock)
    h = c.get_start(keys)
    if not h.result.all_hit:
        q.put(("miss", h.result))
        return
    plan = c.get_transfer(h)
    out = np.empty((len(keys), VALUE_LEN), dtype=np.uint8)
    fx.copy_from_plan(plan, out.ctypes.data, VALUE_LEN)
    c.release_views(plan)
    q.put(("ok", int(out.astype(np.uint64).sum()) == expected_sum))


def _child_writer(sock, keys, q):
    import fluxon as fx
    c = fx.KvClient(socket_path=sock)
    data = np.full((len(keys), VALUE_LEN), 7, dtype=np.uint8)
    plan = c.local_fast_put_start(keys, VALUE_LEN)
    fx.copy_to_plan(plan, data.ctypes.data, VALUE_LEN)
    c.local_fast_put_commit(plan).wait(timeout=10)
    q.put("written")


def test_several_processes_share_one_segment(client, sock):
    keys = [f"mp{i}" for i in range(8)]
    data = put(client, keys)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    readers = [ctx.Process(target=_child_reader,
                           args=(sock, keys, int(data.astype(np.uint64).sum()), q))
               for _ in range(3)]
    for p in readers:
        p.start()
    results = [q.get(timeout=60) for _ in readers]
    for p in readers:
        p.join(timeout=30)
    assert results == [("ok", True)] * 3
    w = ctx.Process(target=_child_writer, args=(sock, ["from-child"], q))
    w.start()
    assert q.get(timeout=60) == "written"
    w.join(timeout=30)
    assert (read(client, ["from-child"]) == 7).all()
    assert_baseline(client)


def test_separate_master_and_owner_processes(daemon_factory, sock):
    mport, aport1, aport2 = free_port(), free_port(), free_port()
    daemon_factory(f"""
role: master
log_level: warn
master: {{listen_address: "127.0.0.1:{mport}"}}
admin: {{listen_address: "127.0.0.1:{aport1}", metrics_port: 0}}
""", name="master")
    daemon_factory(f"""
role: owner
node_id: 3
log_level: warn
admin: {{listen_address: "127.0.0.1:{aport2}", metrics_port: 0}}
owner:
  master_address: 127.0.0.1:{mport}
  socket_path: {sock}
  segment: {{size: 1GiB}}
""", name="owner")
    c = fluxon.KvClient(socket_path=sock)
    assert c.wait_local_segments_ready()[0]["node_id"] == 3
    data = put(c, ["sep0", "sep1"])  # the future completes only after the gRPC publish
    assert np.array_equal(read(c, ["sep0", "sep1"]), data)
    assert c.stats()["publish_batches"] == 1
    assert_baseline(c)


def test_prefault_segment_maps_the_segment_without_changing_values(client):
    data = put(client, ["pf0", "pf1"])
    client.prefault_segment()
    assert np.array_equal(read(client, ["pf0", "pf1"]), data)
    assert_baseline(client)


def test_parent_key_hint_is_validated_and_optional(client):
    keys = [f"pk-{i}" for i in range(3)]
    with pytest.raises(fluxon.InvalidArgumentError, match="parent_key"):
        client.local_fast_put_start(keys, 4096, fluxon.PutOptionalArgs(parent_key=keys[2]))
    with pytest.raises(fluxon.InvalidArgumentError, match="parent_key"):
        client.local_fast_put_start(keys, 4096, fluxon.PutOptionalArgs(parent_key=7))
    h = client.get_start(keys)
    assert h.result.raw_prefix_hit_len == 0  # nothing was reserved
    client.cancel_get_transfer(h)
    plan = client.local_fast_put_start(keys, 4096, fluxon.PutOptionalArgs(parent_key="unknown"))
    client.local_fast_put_commit(plan).wait(timeout=10)
    h = client.get_start(keys)
    assert h.result.raw_prefix_hit_len == 3
    client.cancel_get_transfer(h)


def test_an_aborted_status_is_a_fetch_failure_only_from_get_transfer():
    """Aborted also ends a write-through put ("deleted before its copy was made"): only a
    deferred get_transfer turns it into FetchFailedError."""
    from fluxon.errors import FetchFailedError, FluxonError, from_status
    e = from_status(FetchFailedError.code, "write_through: 3 values were deleted")
    assert type(e) is FluxonError and e.code == FetchFailedError.code
