"""Real fluxond processes under kill -9, restarts, rogue owners and SIGTERM under load.

Each test would fail on the behaviour it guards against: a client of a restarted daemon reading
stale bytes, a second process taking over a live owner's node_id, a restarted owner never
registering again, a SIGTERM that hangs behind publish backpressure or an injected delay.
"""

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import fluxon
from conftest import FLUXOND, Daemon, embedded_config, free_port

VALUE_LEN = 64 * 1024


def put_bytes(client, key, fill, wait=True):
    plan = client.local_fast_put_start([key], VALUE_LEN)
    buf = np.full(VALUE_LEN, fill, dtype=np.uint8)
    fluxon.copy_to_plan(plan, buf.ctypes.data, VALUE_LEN)
    fut = client.local_fast_put_commit(plan)
    if wait:
        fut.wait(10)
    return fut


def get_bytes(client, key):
    h = client.get_start([key])
    if h.result.transferable_len == 0:
        client.cancel_get_transfer(h)
        return None
    plan = client.get_transfer(h)
    out = np.zeros(VALUE_LEN, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, VALUE_LEN)
    client.release_views(plan)
    return out


def kill9(d: Daemon):
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(timeout=10)


def test_client_of_a_daemon_killed_and_restarted_fails_instead_of_reading_stale_bytes(
        daemon_factory, sock):
    first = daemon_factory(embedded_config(sock), name="first")
    stale = fluxon.KvClient(socket_path=sock)
    put_bytes(stale, "k", 0xAA)
    pending = stale.local_fast_put_start(["pending"], VALUE_LEN)
    kill9(first)
    second = daemon_factory(embedded_config(sock), name="second")
    writer = fluxon.KvClient(socket_path=sock)
    put_bytes(writer, "k", 0xBB)

    # Read side: the stale client never serves the old mapping's bytes.
    deadline = time.time() + 5
    while True:
        try:
            got = get_bytes(stale, "k")
        except fluxon.OwnerUnavailableError as e:
            assert "create a new client" in str(e)
            break
        assert got is None or (got == 0xBB).all(), "stale client read the old segment"
        assert time.time() < deadline, "stale client kept working against the new daemon"
        time.sleep(0.05)
    # Write side: every call fails; nothing is reserved on the new daemon.
    with pytest.raises(fluxon.OwnerUnavailableError):
        stale.local_fast_put_start(["fresh"], VALUE_LEN)
    with pytest.raises(fluxon.OwnerUnavailableError):
        stale.local_fast_put_commit(pending)
    s = writer.stats()
    assert s["prepared_puts"] == 0 and s["slots_Prepared"] == 0
    assert (get_bytes(fluxon.KvClient(socket_path=sock), "k") == 0xBB).all()
    second.stop()


def test_killed_client_processes_leave_nothing_behind(daemon, sock, tmp):
    script = tmp / "holder.py"
    script.write_text(f"""
import sys, time, fluxon
c = fluxon.KvClient(socket_path={sock!r})
plan = c.local_fast_put_start(["kept-" + sys.argv[1]], {VALUE_LEN})
fut = c.local_fast_put_commit(plan)
fut.wait(10)
c.local_fast_put_start(["prepared-" + sys.argv[1]], {VALUE_LEN})
h = c.get_start(["kept-" + sys.argv[1]])
c.get_transfer(h)  # views held
c.get_start(["kept-" + sys.argv[1]])  # an unconsumed handle
print("ready", flush=True)
time.sleep(600)
""")
    procs = [subprocess.Popen([os.sys.executable, str(script), str(i)], stdout=subprocess.PIPE,
                              env=os.environ.copy()) for i in range(3)]
    for p in procs:
        assert p.stdout.readline().strip() == b"ready"
    observer = fluxon.KvClient(socket_path=sock)
    s = observer.stats()
    assert s["prepared_puts"] == 3 and s["live_views"] == 3 and s["live_handles"] == 3
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline:
        s = observer.stats()
        if (s["prepared_puts"], s["live_views"], s["live_handles"], s["slots_Prepared"],
                s["client_sessions"]) == (0, 0, 0, 0, 1):
            break
        time.sleep(0.05)
    assert (s["prepared_puts"], s["live_views"], s["live_handles"], s["slots_Prepared"],
            s["client_sessions"]) == (0, 0, 0, 0, 1), s
    for i in range(3):  # the killed puts' keys are free again
        put_bytes(observer, f"prepared-{i}", i)


def cluster_configs(tmp, master_port, lease_ms=1500):
    master = f"""
role: master
log_level: info
master: {{listen_address: "127.0.0.1:{master_port}", owner_lease_ms: {lease_ms}}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
"""

    def owner(node_id, sock, register_timeout_ms=30000):
        return f"""
role: owner
node_id: {node_id}
log_level: info
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  master_address: "127.0.0.1:{master_port}"
  socket_path: {sock}
  segment: {{size: 1GiB}}
  heartbeat_interval_ms: 200
  register_timeout_ms: {register_timeout_ms}
"""
    return master, owner


def test_rogue_owner_is_refused_and_a_killed_owner_comes_back(daemon_factory, sock, tmp):
    master_cfg, owner_cfg = cluster_configs(tmp, free_port())
    daemon_factory(master_cfg, name="master")
    owner_a = daemon_factory(owner_cfg(1, sock), name="owner-a")
    client = fluxon.KvClient(socket_path=sock)
    put_bytes(client, "before", 1)

    # A second process claiming node_id 1 while owner A is live is refused, not obeyed.
    rogue_sock = sock + ".rogue"
    cfg = tmp / "rogue.yaml"
    cfg.write_text(owner_cfg(1, rogue_sock, register_timeout_ms=1500))
    start = time.time()
    rogue = subprocess.run([FLUXOND, "--config", str(cfg)], capture_output=True, text=True,
                           timeout=30)
    assert rogue.returncode != 0
    assert "live owner" in rogue.stdout + rogue.stderr
    assert time.time() - start < 15
    # Owner A's publishes still succeed (its routes were not dropped, its generation not stale).
    put_bytes(client, "after-rogue", 2)

    # kill -9 of owner A, then a restart: it waits out the lease and registers again.
    kill9(owner_a)
    owner_a2 = daemon_factory(owner_cfg(1, sock), name="owner-a2")
    fresh = fluxon.KvClient(socket_path=sock)
    put_bytes(fresh, "after-restart", 3)
    assert (get_bytes(fresh, "after-restart") == 3).all()
    owner_a2.stop()


def test_sigterm_with_commits_blocked_on_a_failing_master_stops_in_bounded_time(
        daemon_factory, sock):
    extra = """faults:
  - {point: master.PublishBatch, action: fail}
"""
    d = daemon_factory(embedded_config(sock, extra_owner="  commit_wait_timeout_ms: 600000",
                                       extra=extra))
    client = fluxon.KvClient(socket_path=sock)
    errors = []

    def flood():
        try:
            for i in range(600):
                put_bytes(client, f"flood-{i}", i % 256, wait=False)
        except fluxon.FluxonError as e:
            errors.append(e)

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    deadline = time.time() + 20
    while time.time() < deadline and client.stats()["publish_queue"] < 512:
        time.sleep(0.05)
    assert client.stats()["publish_queue"] >= 512
    time.sleep(0.3)  # the next commit is waiting on backpressure now
    _sigterm_stops_within_10s(d, t)
    assert errors and isinstance(errors[0], fluxon.OwnerUnavailableError)


def test_sigterm_during_an_injected_hour_long_delay_stops_in_bounded_time(daemon_factory, sock):
    extra = """faults:
  - {point: master.Lookup, action: delay, delay_ms: 3600000}
"""
    d = daemon_factory(embedded_config(sock, extra=extra))
    client = fluxon.KvClient(socket_path=sock)
    result = []
    t = threading.Thread(target=lambda: result.append(_try(client.get_start, ["miss"])),
                         daemon=True)
    t.start()
    time.sleep(0.5)
    assert t.is_alive()  # sleeping in the injected delay
    _sigterm_stops_within_10s(d, t)


def _sigterm_stops_within_10s(d, t):
    """SIGTERM ends `d` cleanly within 10 s, and the client thread `t` blocked on it ends too."""
    start = time.time()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=15) == 0
    assert time.time() - start < 10
    t.join(timeout=10)
    assert not t.is_alive()


def _try(fn, *args):
    try:
        return fn(*args)
    except fluxon.FluxonError as e:
        return e


def test_call_timeout_turns_a_stuck_owner_into_timeout_error(daemon_factory, sock, tmp):
    extra = """faults:
  - {point: master.Lookup, action: delay, delay_ms: 5000}
"""
    daemon_factory(embedded_config(sock, extra=extra))
    os.environ["FLUXON_CALL_TIMEOUT_MS"] = "300"
    try:
        client = fluxon.KvClient(socket_path=sock)
        os.environ["FLUXON_CALL_TIMEOUT_MS"] = "0"
        with pytest.raises(fluxon.InvalidArgumentError):
            fluxon.KvClient(socket_path=sock)
    finally:
        del os.environ["FLUXON_CALL_TIMEOUT_MS"]
    start = time.time()
    with pytest.raises(fluxon.TimeoutError):
        client.get_start(["stuck"])  # a miss: the owner's master lookup is delayed
    assert time.time() - start < 3
    cfg = tmp / "client.yaml"
    cfg.write_text(f"role: client\nclient: {{socket_path: {sock}, call_timeout_ms: 250}}\n")
    from_config = fluxon.KvClient(config_path=str(cfg))
    start = time.time()
    with pytest.raises(fluxon.TimeoutError):
        from_config.get_start(["stuck-2"])
    assert time.time() - start < 3
