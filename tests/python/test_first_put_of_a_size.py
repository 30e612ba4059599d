"""The first put of a new value size (versions issue, item 7): on a 1 GiB owner with no warm
grant holding one 1 MiB value, a 4 KiB put neither evicts the 1 MiB value (its class had free
slots; evicting it frees nothing a 4 KiB claim can use) nor waits for its whole grant to be
populated: the carve populates what the claim takes and the maintenance thread the rest.
Bytes of both values are compared after.
"""

import time

import numpy as np

import fluxon

BIG, SMALL = 1 << 20, 4096


def put(client, key, n, fill):
    t0 = time.monotonic()
    plan = client.local_fast_put_start([key], n)
    buf = np.full(n, fill, dtype=np.uint8)
    fluxon.copy_to_plan(plan, buf.ctypes.data, n)
    client.local_fast_put_commit(plan).wait(30)
    return time.monotonic() - t0


def read(client, key, n):
    h = client.get_start([key])
    if not h.result.all_hit:
        client.cancel_get_transfer(h)
        return None
    plan = client.get_transfer(h)
    out = np.empty(n, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, n)
    client.release_views(plan)
    return out


def test_first_put_of_a_new_size_evicts_nothing_and_waits_for_no_whole_grant(daemon_factory,
                                                                            sock):
    daemon_factory(f"""
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {sock}
  segment: {{size: 1GiB}}
  local_reserve: {{warm_grants: 0, claim_soft_timeout_ms: 5}}
  eviction_interval_ms: 10
""")
    c = fluxon.KvClient(socket_path=sock)
    put(c, "big", BIG, 0x5A)
    time.sleep(0.3)  # past a few maintenance rounds
    took = put(c, "small", SMALL, 0xA5)
    time.sleep(0.5)
    s = c.stats()
    assert s["evicted_pages"] == 0, s
    big = read(c, "big", BIG)
    assert big is not None, "the 1 MiB value was evicted for a 4 KiB put"
    assert (big == 0x5A).all()
    assert (read(c, "small", SMALL) == 0xA5).all()
    # Populating a whole 512 MiB grant takes 0.3-2 s here; the part a 4 KiB claim needs, a few
    # ms. A loose bound for a busy CI machine (bench/first_put.py measures it).
    assert took < 0.25, f"the first 4 KiB put took {took * 1000:.0f} ms"
