"""The SGLang HiCache backend logic (fluxon.hicache) against a real fluxond, with a numpy host
pool that follows sglang 0.5.23's host-pool layouts. Needs neither torch nor sglang."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

import fluxon
from conftest import embedded_config
from fluxon.hicache import FluxonHiCacheBackend, PageStore
from hostpool import NumpyHostPool

LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def storage_config(sock, mla=False, tp_rank=0, tp_size=1, model="org/model-7b", **extra):
    """The fields of sglang 0.5.23's HiCacheStorageConfig."""
    cfg = dict(backend_name="fluxon", module_path="fluxon.sglang",
               class_name="FluxonHiCacheStorage", interface_v1=1, socket=sock,
               reconnect_interval_s=0)
    cfg.update(extra)
    return SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                           attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
                           enable_storage_metrics=True, is_page_first_layout=False,
                           model_name=model, tp_lcm_size=None, should_split_heads=False,
                           dp_rank=0, extra_config=cfg, dcp_size=1, dcp_rank=0,
                           logical_page_size=None)


def backend(cfg, pool):
    b = FluxonHiCacheBackend(cfg, {})
    b.register_mem_pool_host(pool)
    return b


def host_indices(pool, pages):
    return np.concatenate([np.arange(p * pool.page_size, (p + 1) * pool.page_size)
                           for p in pages]).astype(np.int64)


def hashes(n, tag="h"):
    return [f"{tag}{i:060d}" for i in range(n)]


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_round_trip_is_byte_exact(daemon, sock, layout, mla):
    rng = np.random.default_rng(1)
    src, dst = NumpyHostPool(layout, mla), NumpyHostPool(layout, mla)
    writer = backend(storage_config(sock, mla), src)
    reader = backend(storage_config(sock, mla), dst)
    keys = hashes(5)
    src_pages, dst_pages = [3, 0, 7, 9, 4], [1, 2, 5, 11, 15]
    for p in src_pages:
        src.fill_page(p * src.page_size, rng)
    assert reader.batch_exists(keys) == 0
    assert writer.batch_set_v1(keys, host_indices(src, src_pages)) == [True] * 5
    assert reader.batch_exists(keys) == 5
    assert reader.batch_exists(keys + hashes(2, "x")) == 5
    assert reader.batch_exists(hashes(1, "x") + keys) == 0  # prefix, not a count
    assert reader.batch_get_v1(keys, host_indices(dst, dst_pages)) == [True] * 5
    for s, d in zip(src_pages, dst_pages):
        assert np.array_equal(dst.page(d * dst.page_size), src.page(s * src.page_size))
    untouched = set(range(16)) - set(dst_pages)
    assert all(not dst.page(p * dst.page_size).any() for p in untouched)  # nothing spilled over


def test_get_returns_the_stored_prefix_only(daemon, sock):
    rng = np.random.default_rng(2)
    src, dst = NumpyHostPool("page_first"), NumpyHostPool("page_first")
    w, r = backend(storage_config(sock), src), backend(storage_config(sock), dst)
    for p in range(4):
        src.fill_page(p * src.page_size, rng)
    keys = hashes(4)
    assert w.batch_set_v1([keys[0], keys[1], keys[3]], host_indices(src, [0, 1, 3])) == [True] * 3
    assert r.batch_exists(keys) == 2
    assert r.batch_get_v1(keys, host_indices(dst, [4, 5, 6, 7])) == [True, True, False, False]
    assert np.array_equal(dst.page(5 * 4), src.page(1 * 4))
    assert not dst.page(6 * 4).any() and not dst.page(7 * 4).any()


def test_writes_skip_pages_already_stored(daemon, sock):
    rng = np.random.default_rng(3)
    a, b = NumpyHostPool("page_first"), NumpyHostPool("page_first")
    for p in range(6):
        a.fill_page(p * 4, rng)
        b.fill_page(p * 4, rng)
    wa, wb = backend(storage_config(sock), a), backend(storage_config(sock), b)
    keys = hashes(6)
    assert wa.batch_set_v1(keys[:3], host_indices(a, [0, 1, 2])) == [True] * 3
    # keys 1 and 2 exist: b's bytes for them are skipped, 3..5 are written from b.
    assert wb.batch_set_v1(keys[1:], host_indices(b, [1, 2, 3, 4, 5])) == [True] * 5
    dst = NumpyHostPool("page_first")
    r = backend(storage_config(sock), dst)
    assert r.batch_get_v1(keys, host_indices(dst, range(6))) == [True] * 6
    for p in range(6):
        assert np.array_equal(dst.page(p * 4), (a if p < 3 else b).page(p * 4))
    s = wb.get_stats()
    assert s.backup_pgs == [3] and len(s.backup_bandwidth) == 1 and s.backup_bandwidth[0] > 0
    assert r.get_stats().prefetch_pgs == [6]
    assert r.get_stats().prefetch_pgs == []  # stats are per interval


def _stored(sock, cfg_kw, pool_kw, keys):
    pool = NumpyHostPool(**pool_kw)
    return backend(storage_config(sock, **cfg_kw), pool).batch_exists(keys)


def test_namespaces_isolate_layout_dtype_shape_rank_model(daemon, sock):
    rng = np.random.default_rng(4)
    base_pool = dict(layout="page_first")
    src = NumpyHostPool(**base_pool)
    for p in range(2):
        src.fill_page(p * 4, rng)
    keys = hashes(2)
    assert backend(storage_config(sock, tp_rank=0, tp_size=2), src).batch_set_v1(
        keys, host_indices(src, [0, 1])) == [True, True]
    same = dict(tp_rank=0, tp_size=2)
    assert _stored(sock, same, base_pool, keys) == 2
    assert _stored(sock, same, dict(layout="page_first_direct"), keys) == 0
    assert _stored(sock, same, dict(layout="layer_first"), keys) == 0
    assert _stored(sock, same, dict(layout="page_first", dtype=np.float32), keys) == 0
    assert _stored(sock, same, dict(layout="page_first", heads=4), keys) == 0
    assert _stored(sock, same, dict(layout="page_first", page_size=8), keys) == 0
    assert _stored(sock, dict(tp_rank=1, tp_size=2), base_pool, keys) == 0
    assert _stored(sock, dict(tp_rank=0, tp_size=1), base_pool, keys) == 0
    assert _stored(sock, dict(same, model="org/other"), base_pool, keys) == 0
    assert _stored(sock, dict(same, namespace="tenant2"), base_pool, keys) == 0
    assert _stored(sock, dict(same, interface_v1=0), base_pool, keys) == 0  # legacy keys differ


def test_mla_rank0_writes_and_every_rank_reads(daemon, sock):
    rng = np.random.default_rng(5)
    src1 = NumpyHostPool("page_first", mla=True)
    src1.fill_page(0, rng)
    keys = hashes(1)
    rank1 = backend(storage_config(sock, mla=True, tp_rank=1, tp_size=2), src1)
    assert rank1.batch_set_v1(keys, host_indices(src1, [0])) == [True]  # not the writer
    assert rank1.batch_exists(keys) == 0  # ... so nothing was stored
    src0 = NumpyHostPool("page_first", mla=True)
    src0.fill_page(0, rng)
    rank0 = backend(storage_config(sock, mla=True, tp_rank=0, tp_size=2), src0)
    assert rank0.batch_set_v1(keys, host_indices(src0, [0])) == [True]
    for r in range(4):
        dst = NumpyHostPool("page_first", mla=True)
        b = backend(storage_config(sock, mla=True, tp_rank=r, tp_size=4), dst)
        assert b.batch_get_v1(keys, host_indices(dst, [2])) == [True]
        assert np.array_equal(dst.page(8), src0.page(0))
    assert rank0.storage_key(keys[0]) == rank1.storage_key(keys[0])
    mha0 = backend(storage_config(sock, tp_rank=0, tp_size=2), NumpyHostPool("page_first"))
    mha1 = backend(storage_config(sock, tp_rank=1, tp_size=2), NumpyHostPool("page_first"))
    assert mha0.storage_key(keys[0]) != mha1.storage_key(keys[0])
    assert mha0.storage_key(keys[0]).startswith("sglang:" + keys[0] + "_")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_legacy_byte_methods_round_trip(daemon, sock, layout):
    rng = np.random.default_rng(6)
    pool = NumpyHostPool(layout)
    for p in range(3):
        pool.fill_page(p * 4, rng)
    b = backend(storage_config(sock, interface_v1=0), pool)
    keys = hashes(3)
    pages = [pool.get_data_page(p * 4) for p in range(3)]
    assert not b.exists(keys[0])
    assert b.set(keys[0], pages[0]) is True
    assert b.exists(keys[0]) and not b.exists(keys[1])
    assert b.batch_set(keys, pages) is True  # keys[0] is skipped, still True
    assert b.batch_exists(keys) == 3
    got = b.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
    for g, want in zip(got, pages):
        assert g is not None and np.array_equal(g, want)
    one = b.get(keys[2])  # no target: the backend allocates a flat page
    assert np.array_equal(one, pages[2])
    assert b.get("missing") is None
    got = b.batch_get([keys[0], "missing", keys[1]])
    assert got[0] is not None and got[1] is None and got[2] is None  # prefix semantics
    # Draft-style pages of another size live under their own keys.
    small = np.arange(10, dtype=np.float16)
    assert b.set(keys[0] + ".draft", small)
    assert np.array_equal(b.get(keys[0] + ".draft", np.zeros(10, np.float16)), small)
    assert b.get(keys[0] + ".draft", np.zeros(12, np.float16)) is None
    # Raw pointers with sizes (the Mooncake-style legacy contract).
    buf = np.zeros_like(pages[1])
    assert b.batch_get([keys[1]], [buf.ctypes.data], [buf.nbytes])[0] is not None
    assert np.array_equal(buf, pages[1])


def test_daemon_restart_turns_into_misses_then_recovers(daemon_factory, sock):
    d = daemon_factory(embedded_config(sock))
    rng = np.random.default_rng(7)
    pool = NumpyHostPool("page_first")
    for p in range(4):
        pool.fill_page(p * 4, rng)
    b = backend(storage_config(sock), pool)
    keys = hashes(4)
    assert b.batch_set_v1(keys[:2], host_indices(pool, [0, 1])) == [True, True]
    d.stop()
    idx = host_indices(pool, [2, 3])
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys[:2], idx) == [False, False]
    assert b.batch_set_v1(keys[2:], idx) == [False, False]
    assert b.exists(keys[0]) is False and b.get(keys[0]) is None
    assert b.batch_set(keys[:1], [pool.get_data_page(0)]) is False
    assert b.get_stats().errors >= 1
    daemon_factory(embedded_config(sock), name="fluxond-restarted")
    # The restarted owner is empty; the backend reconnects on its own and works again.
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys[2:], idx) == [True, True]
    dst = NumpyHostPool("page_first")
    assert backend(storage_config(sock), dst).batch_get_v1(
        keys[2:], host_indices(dst, [0, 1])) == [True, True]
    assert np.array_equal(dst.page(4), pool.page(12))
    assert b.get_stats().reconnects >= 1


def _half_meta(pool):
    full = pool.get_page_buffer_meta
    pool.get_page_buffer_meta = lambda idx: tuple(x[::2] for x in full(idx))
    return pool


@pytest.mark.parametrize("make,cfg,err", [
    (lambda: _set(NumpyHostPool("page_first"), layout="page_first_kv_split"), {}, "layout"),
    (lambda: _set(NumpyHostPool("page_first"), layout="page_head_split"), {}, "layout"),
    (lambda: NumpyHostPool("page_first"), {"page_size": 64}, "page_size"),
    (lambda: _set(NumpyHostPool("page_first"), page_size=0), {}, "page_size"),
    # Metadata that does not cover page_size tokens of every layer (here: K without V).
    (lambda: _half_meta(NumpyHostPool("page_first")), {}, "mismatch"),
])
def test_bad_pools_fail_at_registration(daemon, sock, make, cfg, err):
    b = FluxonHiCacheBackend(storage_config(sock, **cfg), {})
    with pytest.raises(fluxon.InvalidArgumentError, match=err):
        b.register_mem_pool_host(make())


def _set(obj, **kw):
    for k, v in kw.items():
        setattr(obj, k, v)
    return obj


@pytest.mark.parametrize("extra", [
    {"namespace": ""}, {"namespace": "a:b"}, {"socket": 3}, {"copy_threads": 0},
    {"copy_threads": "4"}, {"reconnect_interval_s": -1}, {"page_size": 0},
    {"deferred_exists": 1}, {"deferred_exists": "yes"},
])
def test_bad_extra_config_fails_at_construction(sock, extra):
    with pytest.raises(fluxon.InvalidArgumentError):
        FluxonHiCacheBackend(storage_config(sock, **extra), {})


def test_split_heads_is_rejected(sock):
    cfg = storage_config(sock)
    cfg.should_split_heads = True
    with pytest.raises(fluxon.InvalidArgumentError, match="split"):
        FluxonHiCacheBackend(cfg, {})


def test_owner_not_running_fails_at_registration(sock):
    b = FluxonHiCacheBackend(storage_config(sock + ".none"), {})
    with pytest.raises(fluxon.OwnerUnavailableError, match="is fluxond running"):
        b.register_mem_pool_host(NumpyHostPool("page_first"))
    with pytest.raises(RuntimeError, match="before register"):
        b.batch_exists(["k"])


def test_config_read_defensively_from_an_old_config_shape(daemon, sock):
    # The Sept-2025 HiCacheStorageConfig: no pp/cp/dcp fields.
    old = SimpleNamespace(tp_rank=0, tp_size=1, is_mla_model=False, is_page_first_layout=True,
                          model_name=None, extra_config={"socket": sock, "interface_v1": 1})
    pool = NumpyHostPool("page_first")
    b = FluxonHiCacheBackend(old)
    b.register_mem_pool_host(pool)
    assert b.batch_set_v1(hashes(1), host_indices(pool, [0])) == [True]


def test_page_store_never_splits_atomic_groups(daemon, sock):
    store = PageStore(sock)
    vals = np.arange(6 * 4096, dtype=np.uint8).reshape(6, 4096) % 251
    ptrs = [int(vals[i].ctypes.data) for i in range(6)]
    sizes = [4096] * 6
    keys = [f"grp{i}" for i in range(6)]
    assert store.put_pages([keys[3]], ptrs[3:4], sizes[3:4], 1, 4096) == [True]
    # Groups [0,1] [2,3] [4,5]: key 3 exists, so group [2,3] is skipped whole.
    res = store.put_pages(keys, ptrs, sizes, 1, 4096, atomic_group_lens=[2, 2, 2])
    assert res == [True, True, False, True, True, True]
    assert store.exists_prefix(keys) == 2
    assert store.exists_prefix(keys[3:]) == 3


def test_native_segment_copy_validates_and_gathers(client):
    plan = client.local_fast_put_start(["s0", "s1"], 8192)
    a = np.full(4096, 1, np.uint8)
    b = np.full(4096, 2, np.uint8)
    c = np.full(8192, 3, np.uint8)
    with pytest.raises(fluxon.InvalidArgumentError, match="add up"):
        fluxon.copy_segments_to_plan(plan, [a.ctypes.data, b.ctypes.data], [4096, 4000], 2, 8192)
    with pytest.raises(fluxon.InvalidArgumentError, match="exceeds"):
        fluxon.copy_segments_to_plan(plan, [c.ctypes.data] * 3, [8192] * 3, 1, 8192)
    with pytest.raises(fluxon.InvalidArgumentError, match="multiple"):
        fluxon.copy_segments_to_plan(plan, [c.ctypes.data] * 3, [8192] * 3, 2, 8192)
    fluxon.copy_segments_to_plan(plan, [a.ctypes.data, b.ctypes.data, c.ctypes.data, 0],
                                 [4096, 4096, 8192, 0], 2, 8192)
    v = fluxon.plan_value_ptrs(plan)
    assert ctypes.string_at(v[0], 8192) == bytes(a) + bytes(b)
    assert ctypes.string_at(v[1], 8192) == bytes(c)
    client.local_fast_put_commit(plan).wait(timeout=10)
    h = client.get_start(["s0"])
    gp = client.get_transfer(h)
    x, y = np.zeros(100, np.uint8), np.zeros(8092, np.uint8)
    fluxon.copy_segments_from_plan(gp, [x.ctypes.data, y.ctypes.data], [100, 8092], 2, 8192)
    client.release_views(gp)
    assert bytes(x) + bytes(y) == bytes(a) + bytes(b)


def test_prefix_keys_become_the_owner_parent_hint(daemon, sock):
    """SGLang's extra_info.prefix_keys[-1] is passed on as the put's parent key (stored-key form);
    a prefix key that is one of the batch's own keys is not (the owner would refuse it)."""
    from types import SimpleNamespace
    pool = NumpyHostPool("page_first")
    b = backend(storage_config(sock), pool)
    keys = hashes(4, "chain")
    sent = []
    real = b._store.put_pages

    def spy(*args, **kw):
        sent.append(kw.get("parent_key"))
        return real(*args, **kw)

    b._store.put_pages = spy
    assert b.batch_set_v1(keys[:2], host_indices(pool, [0, 1])) == [True, True]
    info = SimpleNamespace(prefix_keys=keys[:2], extra_info=None)
    assert b.batch_set_v1(keys[2:], host_indices(pool, [2, 3]), info) == [True, True]
    assert b.batch_set_v1(keys[2:], host_indices(pool, [2, 3]),
                          SimpleNamespace(prefix_keys=keys[2:3], extra_info=None)) == [True] * 2
    assert sent[0] is None
    assert sent[1] == b._keys.key(keys[1]) and sent[1] != keys[1]
    assert sent[2] is None
    assert b.batch_exists(keys) == 4


def test_clear_deletes_this_namespace_only_and_keeps_pages_in_use(daemon, sock, client):
    pool = NumpyHostPool("page_first")
    a = backend(storage_config(sock, namespace="clear-a"), pool)
    a_mla = backend(storage_config(sock, mla=True, namespace="clear-a"), NumpyHostPool("page_first", True))
    b = backend(storage_config(sock, namespace="clear-b"), pool)
    keys = hashes(3, "clr")
    assert a.batch_set_v1(keys, host_indices(pool, [0, 1, 2])) == [True] * 3
    assert a_mla.batch_set_v1(keys, host_indices(pool, [0, 1, 2])) == [True] * 3
    assert b.batch_set_v1(keys, host_indices(pool, [0, 1, 2])) == [True] * 3
    assert a.set("legacy-page", pool.get_dummy_flat_data_page())
    # A reader holds a's first page while clear() runs: it stays, the rest go.
    held = client.get_start([a._keys.key(keys[0])])
    assert held.result.transferable_len == 1
    a.clear()
    assert a.batch_exists(keys) == 1 and a.batch_exists(keys[1:]) == 0
    assert a_mla.batch_exists(keys) == 0  # the whole namespace, every layout and rank
    assert not a.exists("legacy-page")
    assert b.batch_exists(keys) == 3  # another namespace is untouched
    client.cancel_get_transfer(held)
    a.clear()
    assert a.batch_exists(keys) == 0
    # Cleared keys can be written again.
    assert a.batch_set_v1(keys, host_indices(pool, [0, 1, 2])) == [True] * 3
    assert a.batch_exists(keys) == 3


def test_delete_prefix_validates(client):
    with pytest.raises(fluxon.InvalidArgumentError):
        client.delete_prefix("")
    with pytest.raises(fluxon.InvalidArgumentError):
        client.delete_prefix(None)
    assert client.delete_prefix("no-such-prefix:") == (0, 0)
