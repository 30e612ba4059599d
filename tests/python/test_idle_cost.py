"""An idle owner's CPU does not grow with what it holds: after 1 M values are put (no traffic
afterwards) fluxond uses about as little CPU as before the first put. Maintenance runs by
deadline (handles, puts, remote gets) and over grants (refill, shrink), never over every value,
and refill and shrink agree on a class's spare so an idle owner never carves and punches out
the same grant in turn (tests/unit/slot_pool_test.cc IdleRefillAndShrinkReachAFixedPoint).
"""

import os
import time

import numpy as np
import pytest

import fluxon
from conftest import embedded_config

VALUES = 1 << 20
VALUE_LEN = 4096  # the smallest slot: 1 M values fill 4 GiB
BATCH = 1024
# Idle CPU of the whole process, in % of one core. Before the fix an owner with a nearly full
# class spent ~5 % carving and punching out a spare grant every shrink_idle; idle now is ~0.2 %.
IDLE_LIMIT_PCT = 2.0


def process_cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_pct(pid, seconds):
    a = process_cpu_seconds(pid)
    time.sleep(seconds)
    return (process_cpu_seconds(pid) - a) / seconds * 100


def test_idle_cpu_does_not_grow_with_resident_values(daemon_factory, sock):
    # shrink_idle 200 ms: a carve/shrink cycle, if any, would repeat many times in the window.
    config = embedded_config(sock, size="5GiB").replace(
        "claim_hard_timeout_ms: 1000}", "claim_hard_timeout_ms: 1000, shrink_idle_ms: 200}")
    d = daemon_factory(config)
    time.sleep(0.5)
    before = idle_cpu_pct(d.proc.pid, 3)
    client = fluxon.KvClient(socket_path=sock)
    buf = np.full(BATCH * VALUE_LEN, 3, dtype=np.uint8)
    for b in range(VALUES // BATCH):
        plan = client.local_fast_put_start([f"idle-{b}-{i}" for i in range(BATCH)], VALUE_LEN)
        fluxon.copy_to_plan(plan, buf.ctypes.data, VALUE_LEN)
        client.local_fast_put_commit(plan).wait(30)
    assert client.stats()["keys"] == VALUES
    time.sleep(3.0)  # the last publishes and hot-tier admission settle (about a second)
    after = idle_cpu_pct(d.proc.pid, 5)
    assert client.stats()["keys"] == VALUES  # nothing was evicted meanwhile
    print(f"idle CPU: {before:.2f} % before, {after:.2f} % with {VALUES} values resident")
    assert after <= max(IDLE_LIMIT_PCT, 2 * before), (before, after)
