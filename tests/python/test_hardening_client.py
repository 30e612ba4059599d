"""Hardening of the Python client: every bad argument raises fluxon.InvalidArgumentError before
anything is reserved or sent, forged or stale plan pointers never crash the process, and a killed
client's temporary state is released by the owner."""

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fluxon
import kv_pages
from fluxon import _native
from conftest import embedded_config

VALUE_LEN = 4096
U64 = 2**64

# Counters that must be back to zero once nothing is in flight.
TEMPORARY = ("prepared_puts", "slots_Prepared", "live_views", "live_handles", "reserved_entries",
             "inflight_gets")


def temporary(client):
    s = client.stats()
    return {k: s[k] for k in TEMPORARY}


def assert_nothing_reserved(client, before):
    assert temporary(client) == before
    s = client.stats()
    assert s["client_active_plans"] == 0 and s["client_handles"] == 0


def put(client, keys, value_len=VALUE_LEN, fill=7):
    data = np.full((len(keys), value_len), fill, dtype=np.uint8)
    plan = client.local_fast_put_start(keys, value_len)
    fluxon.copy_to_plan(plan, data.ctypes.data, value_len)
    client.local_fast_put_commit(plan).wait(timeout=10)


read = functools.partial(kv_pages.read_hit, value_len=VALUE_LEN)


def run_script(sock, body: str, timeout=60) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh interpreter (c: a KvClient on `sock`); a crash shows as a
    non-zero exit of the child, not of pytest."""
    src = "import sys, numpy as np, fluxon\nc = fluxon.KvClient(socket_path=sys.argv[1])\n"
    return subprocess.run([sys.executable, "-c", src + textwrap.dedent(body), sock],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def test_limits_are_exposed():
    assert fluxon.MAX_KEY_BYTES == _native.MAX_KEY_BYTES == 4096
    assert fluxon.MAX_BATCH_KEYS == _native.MAX_BATCH_KEYS == 65536
    assert fluxon.MAX_VALUE_LEN == 512 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Keys


@pytest.mark.parametrize("call, where", [
    (lambda c: c.local_fast_put_start(["ok", "bad\udcff"], VALUE_LEN), r"keys\[1\]"),
    (lambda c: c.get_start(["ok", "\ud800"]), r"keys\[1\]"),
    (lambda c: c.local_fast_put_start(["ok"], VALUE_LEN, fluxon.PutOptionalArgs(
        parent_key="p\udcff")), "parent_key"),
    (lambda c: c.local_fast_put_start(["ok"], VALUE_LEN, fluxon.PutOptionalArgs(
        lease_id="l\udcff")), "lease_id"),
    (lambda c: c.delete_prefix("ns\udcff"), "prefix"),
])
def test_non_utf8_text_is_invalid_argument(client, call, where):
    before = temporary(client)
    with pytest.raises(fluxon.InvalidArgumentError, match=where + ".*UTF-8"):
        call(client)
    assert_nothing_reserved(client, before)
    assert client.stats()["keys"] == 0


def test_non_utf8_key_rejected_by_the_native_layer_too(client):
    # The private binding converts keys itself: no raw TypeError even when called directly.
    with pytest.raises(_native.Error) as e:
        client._c.get_start(["ok", "\udcff"], True, [])
    code, message, _ = e.value.args
    assert code == 3 and "keys[1]" in message
    with pytest.raises(_native.Error):
        client._c.delete_prefix("\udcff")


def test_key_byte_limit(client):
    longest = "k" * 4096
    multibyte = "\u00e9" * 2048  # 4096 bytes of UTF-8
    put(client, [longest, multibyte])
    assert (read(client, [longest, multibyte]) == 7).all()
    before = temporary(client)
    for bad in ("k" * 4097, "\u00e9" * 2049):
        with pytest.raises(fluxon.InvalidArgumentError, match=r"keys\[1\].*4096"):
            client.local_fast_put_start(["fine", bad], VALUE_LEN)
        with pytest.raises(fluxon.InvalidArgumentError, match=r"keys\[0\]"):
            client.get_start([bad])
        with pytest.raises(fluxon.InvalidArgumentError, match="parent_key"):
            client.local_fast_put_start(["fine"], VALUE_LEN,
                                        fluxon.PutOptionalArgs(parent_key=bad))
        with pytest.raises(fluxon.InvalidArgumentError, match="prefix"):
            client.delete_prefix(bad)
    assert_nothing_reserved(client, before)
    assert client.delete_prefix(longest) == (1, 0)


def test_oversized_batch_is_rejected_before_any_reservation(client):
    n = fluxon.MAX_BATCH_KEYS + 1
    keys = [f"b{i}" for i in range(n)]
    before = client.stats()
    with pytest.raises(fluxon.InvalidArgumentError, match=str(fluxon.MAX_BATCH_KEYS)):
        client.local_fast_put_start(keys, VALUE_LEN)
    with pytest.raises(fluxon.InvalidArgumentError, match=str(fluxon.MAX_BATCH_KEYS)):
        client.get_start(keys)
    after = client.stats()
    for k in ("prepared_puts", "slots_Prepared", "keys", "live_handles", "client_active_plans"):
        assert after[k] == before[k], k
    with pytest.raises(_native.Error):  # the binding checks the limit too
        client._c.get_start(keys, True, [])


# ---------------------------------------------------------------------------------------------
# Integers and other arguments


def _bad_integer_calls():
    big = U64
    return [
        lambda c, p: c.local_fast_put_start(["i0"], big),
        lambda c, p: c.local_fast_put_start(["i0"], 2**63),
        lambda c, p: c.local_fast_put_start(["i0"], VALUE_LEN,
                                            fluxon.PutOptionalArgs(atomic_group_lens=[big])),
        lambda c, p: c.local_fast_put_start(["i0"], VALUE_LEN,
                                            fluxon.PutOptionalArgs(write_through="yes")),
        lambda c, p: c.get_start(["i0"], atomic_group_lens=[-big]),
        lambda c, p: c.get_start(["i0"], prefix_best_effort=[1]),
        lambda c, p: c.local_fast_put_commit(-1),
        lambda c, p: c.local_fast_put_commit(big),
        lambda c, p: c.put_abort(-1),
        lambda c, p: c.put_abort(big),
        lambda c, p: c.release_views(-1),
        lambda c, p: c.release_views(big),
        lambda c, p: c.release_views(1.0),
        lambda c, p: fluxon.plan_value_ptrs(-1),
        lambda c, p: fluxon.plan_value_ptrs(big),
        lambda c, p: fluxon.plan_value_ptrs("0x10"),
        lambda c, p: fluxon.copy_to_plan(-1, p.host, VALUE_LEN),
        lambda c, p: fluxon.copy_to_plan(big, p.host, VALUE_LEN),
        lambda c, p: fluxon.copy_to_plan(p.plan, -1, VALUE_LEN),
        lambda c, p: fluxon.copy_to_plan(p.plan, big, VALUE_LEN),
        lambda c, p: fluxon.copy_to_plan(p.plan, 0, VALUE_LEN),
        lambda c, p: fluxon.copy_to_plan(p.plan, p.host, big),
        lambda c, p: fluxon.copy_to_plan(p.plan, p.host, 0),
        lambda c, p: fluxon.copy_to_plan(p.plan, p.host, VALUE_LEN, threads=big),
        lambda c, p: fluxon.copy_to_plan(p.plan, p.host, VALUE_LEN, threads=0),
        lambda c, p: fluxon.copy_from_plan(p.plan, p.host, VALUE_LEN, threads=-1),
        lambda c, p: fluxon.copy_from_plan(big, p.host, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_to_plan(p.plan, [p.host], [VALUE_LEN], big, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_to_plan(p.plan, [-1], [VALUE_LEN], 1, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_to_plan(p.plan, [big], [VALUE_LEN], 1, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_to_plan(p.plan, ["x"], [VALUE_LEN], 1, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_to_plan(p.plan, 5, [VALUE_LEN], 1, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_to_plan(p.plan, [p.host], [-1], 1, VALUE_LEN),
        # Sizes that wrap around 2**64 to add up to value_len.
        lambda c, p: fluxon.copy_segments_to_plan(p.plan, [p.host, p.host],
                                                  [big - VALUE_LEN, 2 * VALUE_LEN], 2, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_from_plan(p.plan, [p.host], [big], 1, VALUE_LEN),
        lambda c, p: fluxon.copy_segments_from_plan(p.plan, [p.host], [VALUE_LEN], 1, big),
        lambda c, p: fluxon.copy_segments_from_plan(p.plan, [p.host], [VALUE_LEN], 1, VALUE_LEN,
                                                    threads=big),
        lambda c, p: fluxon.copy_segments_from_plan(-1, [p.host], [VALUE_LEN], 1, VALUE_LEN),
        lambda c, p: fluxon.KvClient(socket_path="/tmp/\udcff.sock"),
        lambda c, p: fluxon.KvClient(socket_path=7),
    ]


class _Plan:
    def __init__(self, plan, host):
        self.plan, self.host = plan, host


@pytest.mark.parametrize("i", range(len(_bad_integer_calls())))
def test_bad_integers_raise_invalid_argument(client, i):
    buf = np.zeros(4 * VALUE_LEN, dtype=np.uint8)
    plan = client.local_fast_put_start(["i-live"], VALUE_LEN)
    before = temporary(client)
    with pytest.raises(fluxon.InvalidArgumentError):
        _bad_integer_calls()[i](client, _Plan(plan, buf.ctypes.data))
    assert temporary(client) == before
    # The plan is untouched and still usable.
    assert len(fluxon.plan_value_ptrs(plan)) == 1
    client.put_abort(plan)


def test_get_transfer_and_future_arguments(client):
    put(client, ["gt0", "gt1"])
    h = client.get_start(["gt0", "gt1"])
    for bad in (U64, -U64, 2**32 + 1, "1", 1.0):
        with pytest.raises(fluxon.InvalidArgumentError, match="consume_prefix_len"):
            client.get_transfer(h, consume_prefix_len=bad)
    client.cancel_get_transfer(h)
    plan = client.local_fast_put_start(["gt2"], VALUE_LEN)
    fut = client.local_fast_put_commit(plan)
    for bad in ("1", float("nan"), -1, [1]):
        with pytest.raises(fluxon.InvalidArgumentError, match="timeout"):
            fut.wait(timeout=bad)
    fut.wait(timeout=float("inf"))
    fut.wait(timeout=1e300)
    fut.wait(timeout=np.float64(5))


def test_numpy_integers_are_accepted(client):
    data = np.arange(2 * VALUE_LEN, dtype=np.uint64).astype(np.uint8).reshape(2, VALUE_LEN)
    plan = client.local_fast_put_start(["np0", "np1"], np.int64(VALUE_LEN))
    ptrs = np.array([data[0].ctypes.data, data[1].ctypes.data], dtype=np.uint64)
    sizes = np.array([VALUE_LEN, VALUE_LEN], dtype=np.uint64)
    fluxon.copy_segments_to_plan(np.uint64(plan), ptrs, sizes, np.int32(1), VALUE_LEN,
                                 np.int8(2))
    client.local_fast_put_commit(plan).wait(timeout=10)
    assert np.array_equal(read(client, ["np0", "np1"]), data)


# ---------------------------------------------------------------------------------------------
# Plan pointers


def test_forged_plan_pointers_fail_cleanly_in_a_subprocess(client, sock):
    r = run_script(sock, """
        import gc
        from fluxon import InvalidArgumentError, FluxonError, NotFoundError
        buf = np.zeros(1 << 20, dtype=np.uint8)
        host = buf.ctypes.data
        live = c.local_fast_put_start(["forge-live"], 4096)
        base, size = c.plan_arena()
        calls = {
            "plan_value_ptrs": lambda p: fluxon.plan_value_ptrs(p),
            "copy_to_plan": lambda p: fluxon.copy_to_plan(p, host, 4096),
            "copy_from_plan": lambda p: fluxon.copy_from_plan(p, host, 4096),
            "copy_segments_to_plan":
                lambda p: fluxon.copy_segments_to_plan(p, [host], [4096], 1, 4096),
            "copy_segments_from_plan":
                lambda p: fluxon.copy_segments_from_plan(p, [host], [4096], 1, 4096),
        }
        # A dropped client's plan: its arena is gone, so the pointer belongs to no live client.
        other = fluxon.KvClient(socket_path=sys.argv[1])
        stale = other.local_fast_put_start(["forge-stale"], 4096)
        del other
        gc.collect()
        outside = [12345, 8, host, live + size * 4, base + size, stale]
        inside = [base + 8, live + 8, live + 16, base + size - 8]  # in the arena, never issued
        for name, call in calls.items():
            for p in outside:
                try:
                    call(p)
                except InvalidArgumentError as e:
                    assert "not a plan of any live fluxon client" in str(e), e
                else:
                    raise SystemExit(f"{name}({p:#x}) did not raise")
            for p in inside:
                try:
                    call(p)
                except NotFoundError:
                    pass
                else:
                    raise SystemExit(f"{name}({p:#x}) inside the arena did not raise NotFound")
        c.put_abort(live)
        print("caught all")
    """)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "caught all" in r.stdout


def test_consumed_plans_fail_cleanly(client):
    buf = np.zeros(2 * VALUE_LEN, dtype=np.uint8)
    plan = client.local_fast_put_start(["c0", "c1"], VALUE_LEN)
    fluxon.copy_to_plan(plan, buf.ctypes.data, VALUE_LEN)
    client.local_fast_put_commit(plan).wait(timeout=10)
    consumed_errors = (fluxon.PlanStateError, fluxon.NotFoundError)
    with pytest.raises(consumed_errors):
        fluxon.copy_to_plan(plan, buf.ctypes.data, VALUE_LEN)
    with pytest.raises(consumed_errors):
        fluxon.copy_segments_to_plan(plan, [buf.ctypes.data], [VALUE_LEN], 1, VALUE_LEN)
    with pytest.raises(consumed_errors):
        fluxon.plan_value_ptrs(plan)
    h = client.get_start(["c0", "c1"])
    gp = client.get_transfer(h)
    client.release_views(gp)
    with pytest.raises(consumed_errors):
        fluxon.copy_from_plan(gp, buf.ctypes.data, VALUE_LEN)
    with pytest.raises(consumed_errors):
        fluxon.copy_segments_from_plan(gp, [buf.ctypes.data], [VALUE_LEN], 1, VALUE_LEN)
    s = client.stats()
    assert s["client_active_plans"] == 0 and s["live_views"] == 0


def test_segment_copy_cannot_exceed_the_plan(client):
    buf = np.zeros(3 * VALUE_LEN, dtype=np.uint8)
    plan = client.local_fast_put_start(["s0", "s1"], VALUE_LEN)
    with pytest.raises(fluxon.InvalidArgumentError, match="exceeds the plan's 2 values"):
        fluxon.copy_segments_to_plan(plan, [buf.ctypes.data] * 3, [VALUE_LEN] * 3, 1, VALUE_LEN)
    client.put_abort(plan)


def test_copy_value_len_cannot_run_past_the_segment(daemon_factory, sock):
    daemon_factory(embedded_config(sock, size="512MiB"))
    # The blob does not record value_len: a larger one than the plan's values is caught when it
    # would reach past the segment mapping, before the copy touches host_ptr (8: never read).
    r = run_script(sock, """
        plan = c.local_fast_put_start(["t0", "t1"], 256 << 20)  # the whole grant
        seg = c.wait_local_segments_ready()[0]
        too_long = seg["write_ptr"] + seg["len"] - max(fluxon.plan_value_ptrs(plan)) + 1
        assert too_long <= fluxon.MAX_VALUE_LEN, too_long
        for copy in (fluxon.copy_to_plan, fluxon.copy_from_plan):
            try:
                copy(plan, 8, too_long)
            except fluxon.InvalidArgumentError as e:
                assert "runs past the segment" in str(e), e
            else:
                raise SystemExit("no error")
        for copy in (fluxon.copy_segments_to_plan, fluxon.copy_segments_from_plan):
            try:
                copy(plan, [8, 8], [too_long, too_long], 1, too_long)
            except fluxon.InvalidArgumentError as e:
                assert "runs past the segment" in str(e), e
            else:
                raise SystemExit("no error")
        c.put_abort(plan)
        print("caught all")
    """)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "caught all" in r.stdout


def test_plans_resolve_to_their_own_client(client, sock):
    other = fluxon.KvClient(socket_path=sock)
    data = np.full((1, VALUE_LEN), 9, dtype=np.uint8)
    mine = client.local_fast_put_start(["own-a"], VALUE_LEN)
    theirs = other.local_fast_put_start(["own-b"], VALUE_LEN)
    fluxon.copy_to_plan(theirs, data.ctypes.data, VALUE_LEN)  # found in `other`'s arena
    with pytest.raises(fluxon.NotFoundError):
        client.put_abort(theirs)  # not issued by `client`
    other.local_fast_put_commit(theirs).wait(timeout=10)
    client.put_abort(mine)
    assert (read(client, ["own-b"]) == 9).all()


# ---------------------------------------------------------------------------------------------
# A killed client


KILLED_CHILD = """
    put_plan = c.local_fast_put_start(["killed-0", "killed-1"], 4096)
    h = c.get_start(["kept-0"])
    get_plan = c.get_transfer(h)  # views on kept-0
    h2 = c.get_start(["kept-0"])  # a live handle
    print("ready", flush=True)
    import time
    time.sleep(120)
"""


def test_killed_client_state_is_released(client, sock):
    put(client, ["kept-0"])
    base = temporary(client)
    assert all(v == 0 for v in base.values()), base
    src = ("import sys, numpy as np, fluxon\nc = fluxon.KvClient(socket_path=sys.argv[1])\n"
           + textwrap.dedent(KILLED_CHILD))
    child = subprocess.Popen([sys.executable, "-c", src, sock], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "ready", (line, child.stderr.read() if child.poll() is not None
                                         else "")
        held = temporary(client)
        assert held["prepared_puts"] >= 1 and held["slots_Prepared"] >= 2, held
        assert held["live_views"] >= 1 and held["live_handles"] >= 1, held
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()
        child.stderr.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = temporary(client)
        if all(now[k] == 0 for k in ("prepared_puts", "slots_Prepared", "live_views",
                                     "live_handles")):
            break
        time.sleep(0.05)
    assert all(now[k] == 0 for k in ("prepared_puts", "slots_Prepared", "live_views",
                                     "live_handles")), now
    put(client, ["killed-0", "killed-1"], fill=3)  # no KeyConflictError
    assert (read(client, ["killed-0", "killed-1"]) == 3).all()
