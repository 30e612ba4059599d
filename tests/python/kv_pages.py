"""Pages through the hostless API, shared by the client and multi-process tests: page i of a
batch put with `seed` holds the byte (seed + i) % 251; read_hit reads back values that must all
hit."""

import numpy as np

import fluxon


def put_pages(client, keys, seed, value_len):
    plan = client.local_fast_put_start(keys, value_len)
    buf = np.empty(len(keys) * value_len, dtype=np.uint8)
    for i in range(len(keys)):
        buf[i * value_len:(i + 1) * value_len] = (seed + i) % 251
    fluxon.copy_to_plan(plan, buf.ctypes.data, value_len)
    client.local_fast_put_commit(plan).wait(10)


def get_pages(client, keys, value_len):
    """Returns (transferable_len, bytes of the prefix)."""
    h = client.get_start(keys)
    t = h.result.transferable_len
    if t == 0:
        client.cancel_get_transfer(h)
        return 0, None
    plan = client.get_transfer(h)
    out = np.zeros(t * value_len, dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, value_len)
    client.release_views(plan)
    return t, out


def read_hit(client, keys, value_len):
    """The values of `keys`, one row each; every key must hit."""
    h = client.get_start(keys)
    assert h.result.all_hit, h.result
    plan = client.get_transfer(h)
    out = np.empty((len(keys), value_len), dtype=np.uint8)
    fluxon.copy_from_plan(plan, out.ctypes.data, value_len)
    client.release_views(plan)
    return out
