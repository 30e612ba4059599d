"""fluxon.sglang_linker.FluxonLinker without torch or a GPU.

* The contract with the pinned SGLang (0.5.23) is read from its source with `ast` (importing it
  needs torch): the keywords the dynamic linker factory passes, every abstract method of
  UnifiedCacheLinker implemented with SGLang's parameter names, the config SGLang parses.
* The linker's logic runs with stand-ins for the CUDA side (no bytes move) against a real fluxond
  or a fake client: key namespacing (the storage backend's key function, apart from its pages),
  pool refusal, lookup handles consumed or cancelled, offload skips and failure reports, the
  daemon going away. tests/gpu/test_linker_real.py moves real bytes through real SGLang pools.
"""

import ast
import importlib.util
import inspect
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import fluxon
from fluxon.errors import InvalidArgumentError, KeyConflictError, OwnerUnavailableError
from fluxon.hicache import SUPPORTED_LAYOUTS, FluxonHiCacheBackend, KeyScheme, RankIdentity
from fluxon.sglang_linker import (LINKER_LAYOUT, CudaOps, FluxonLinker, LinkerConfig, PoolView,
                                  pages_from_token_slots)
from hostpool import NumpyHostPool
from test_hicache import storage_config
from test_sglang_backend import _class, _sglang_dir

PAGE = 4
LAYERS = 3


# ---- stand-ins --------------------------------------------------------------------------------


class Buf:
    """A device buffer as PoolView reads it (shape, numel, element_size, contiguity)."""

    def __init__(self, tokens, row_elems, elem=2):
        self.shape = (tokens, row_elems)
        self._elem = elem
        self.dtype = "bfloat16"

    def numel(self):
        return self.shape[0] * self.shape[1]

    def element_size(self):
        return self._elem

    def is_contiguous(self):
        return True


class MHATokenToKVPool:  # the class names are what the linker checks
    def __init__(self, pages=16, heads=2, head_dim=8, layers=LAYERS):
        self.page_size, self.dtype = PAGE, "torch.bfloat16"
        self.head_num, self.head_dim, self.layer_num = heads, head_dim, layers
        self.k_buffer = [Buf(pages * PAGE, heads * head_dim) for _ in range(layers)]
        self.v_buffer = [Buf(pages * PAGE, heads * head_dim) for _ in range(layers)]


class MLATokenToKVPool:
    def __init__(self, pages=16, layers=LAYERS):
        self.page_size, self.dtype = PAGE, "torch.bfloat16"
        self.kv_lora_rank, self.qk_rope_head_dim, self.layer_num = 16, 8, layers
        self.kv_buffer = [Buf(pages * PAGE, 24) for _ in range(layers)]


class SWAKVPool(MHATokenToKVPool):
    pass


class HybridLinearKVPool(MHATokenToKVPool):
    pass


class Slots(list):
    """Device token slots (a tensor in SGLang)."""

    def numel(self):
        return len(self)


def slots(pages):
    return Slots(p * PAGE + j for p in pages for j in range(PAGE))


class Event:
    def __init__(self):
        self.waits = 0
        self.done = True

    def synchronize(self):
        assert self.done, "a host wait on a write still running (the fake never finishes it)"

    def query(self):
        return self.done

    def wait(self):  # the current stream waits on the device
        self.waits += 1


class FakeOps:
    """The CUDA side: records launches, moves nothing."""

    def __init__(self):
        self.restores, self.writes, self.inline, self.events = [], [], [], []

    def record_ready(self):
        return Event()

    def offload_ready(self, linker):
        return [Event()]

    def bind_thread(self):
        pass

    def device_pages(self, s, events, offload, offset=0, inline=False):
        return pages_from_token_slots(list(s), PAGE, 16)

    def inline_slots(self, s, events, offload=False):  # the kernels read the slots
        return s

    def restore_all(self, plane, work):
        self.inline.extend((plan, tuple(pages_from_token_slots(list(s), PAGE, 16)))
                           for plan, s, n in work)
        self.events.append(Event())
        return self.events[-1]

    def drain_inline(self, offload=False):
        pass

    def select(self, pages, idx, inline=False):
        return [pages[i] for i in idx]

    def write_inline(self, plane, plan, pages_dev, n, by_slots=False):
        if by_slots:  # token slots: the kernel derives the pages
            pages_dev = pages_from_token_slots(list(pages_dev), PAGE, 16)
        self.write(plane, plan, pages_dev, n)
        self.events.append(Event())
        return self.events[-1]

    def layer_path(self, pages):
        return "kernel"

    def restore_layers(self, plane, work, begin, count, path, continues):
        for layer in range(begin, begin + count):
            for plan, pages, n in work:
                self.restore_layer(plane, plan, pages, layer)

    def restore_layer(self, plane, plan, pages, layer):
        self.restores.append((layer, plan, tuple(pages)))

    def layer_done(self, layer):
        return True

    def wait_layer(self, layer):
        pass

    def write(self, plane, plan, pages_dev, n):
        assert len(pages_dev) == n
        self.writes.append((plan, tuple(pages_dev)))

    def finish_offload(self):
        pass

    def drain(self, offload):
        pass


def params(pool):
    return SimpleNamespace(page_size=PAGE, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                           token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: pool))


SERVER_ARGS = SimpleNamespace(model_path="org/model-7b", served_model_name=None, tp_size=1,
                              enable_linker_mla_dedup=False)


def make(pool=None, ops=None, client_factory=None, components=("FULL",), **extra):
    extra = {"reconnect_interval_s": 0, **extra}
    return FluxonLinker(SERVER_ARGS, params(pool or MHATokenToKVPool()), components=set(components),
                        extra_config=extra, forward_stream=None, _ops=ops or FakeOps(),
                        _client_factory=client_factory)


def kv(keys, pages=None):
    return [SimpleNamespace(name="kv", keys=list(keys),
                            device_indices=None if pages is None else slots(pages))]


def hashes(n, tag="h"):
    return [f"{tag}{i:062x}" for i in range(n)]


def wait_results(linker, n, timeout=10):
    deadline = time.time() + timeout
    while linker.num_completed_offloads() < n:
        assert time.time() < deadline, "offloads did not complete"
        time.sleep(0.01)
    return [linker.pop_completed_offload() for _ in range(n)]


def daemon_linker(sock, **kw):
    """A linker whose clients connect to the fluxond on `sock`."""
    return make(client_factory=lambda s: fluxon.KvClient(socket_path=sock), **kw)


def offloaded_pair(lk, tag):
    """Two pages (from slots 1 and 2) offloaded through `lk` and reported done; their keys."""
    keys = hashes(2, tag)
    lk.offload(kv(keys, [1, 2]))
    assert wait_results(lk, 1) == [True]
    return keys


# ---- the contract with SGLang, from its source ------------------------------------------------


def test_factory_passes_the_keywords_we_accept():
    fn = next(n for n in ast.walk(ast.parse(
        (_sglang_dir() / "srt/mem_cache/unified_cache/linker_factory.py").read_text()))
        if isinstance(n, ast.FunctionDef) and n.name == "create_unified_cache_linker")
    dynamic = next(n for n in ast.walk(fn) if isinstance(n, ast.If)
                   and "dynamic" in ast.unparse(n.test))
    calls = [c for c in ast.walk(dynamic) if isinstance(c, ast.Call)
             and getattr(c.func, "id", None) == "linker_cls"]
    assert len(calls) == 1
    call = calls[0]
    assert len(call.args) == 2
    kws = {k.arg for k in call.keywords}
    assert kws == {"components", "extra_config", "forward_stream"}
    inspect.signature(FluxonLinker).bind(object(), object(), **{k: None for k in kws})
    # The checks it makes on the class: a UnifiedCacheLinker subclass, not abstract.
    text = ast.unparse(dynamic)
    assert "issubclass(linker_cls, UnifiedCacheLinker)" in text and "isabstract" in text


def test_every_abstract_method_is_implemented_with_sglang_parameters():
    cls = _class(_sglang_dir() / "srt/mem_cache/unified_cache/unified_cache_linker.py",
                 "UnifiedCacheLinker")
    abstract = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)
                and any(getattr(d, "id", None) == "abstractmethod" for d in f.decorator_list)}
    assert set(abstract) == {"lookup", "load", "start_layer_wise_loading",
                             "finish_layer_wise_loading", "cancel_queued_load", "offload",
                             "num_completed_offloads", "pop_completed_offload", "reset", "close"}
    for name, f in abstract.items():
        assert name in FluxonLinker.__dict__, name
        theirs = [a.arg for a in f.args.args]
        ours = list(inspect.signature(FluxonLinker.__dict__[name]).parameters)
        assert ours == theirs, (name, ours, theirs)
    # Attributes the wrapper and the registry read from a linker.
    text = (_sglang_dir() / "srt/mem_cache/unified_cache/unified_cache_linker.py").read_text()
    assert "cache_linker.pools" in text and "cache_linker.layer_done_counter" in text


def _sglang_linker_config():
    path = _sglang_dir() / "srt/mem_cache/unified_cache/linker_config.py"
    src = path.read_text()
    assert "import torch" not in src  # torch-free by design: loadable here
    spec = importlib.util.spec_from_file_location("_sgl_linker_config", path)
    mod = importlib.util.module_from_spec(spec)
    import sys
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.UnifiedCacheLinkerConfig


def test_launch_config_parses_in_sglang_and_ours():
    cfg = _sglang_linker_config().from_dict(
        {"linker": "FluxonLinker", "linker_module_path": "fluxon.sglang_linker",
         "linker_extra_config": {"socket": "/tmp/x.sock", "namespace": "prod",
                                 "lookup_hold_s": 2}})
    mod = importlib.import_module(cfg.linker_module_path)
    assert getattr(mod, cfg.linker) is FluxonLinker
    ours = LinkerConfig.from_extra(cfg.linker_extra_config)
    assert (ours.socket, ours.namespace, ours.lookup_hold_s) == ("/tmp/x.sock", "prod", 2.0)
    # fluxon.sglang names it too (that module needs SGLang importable, so check its source).
    src = (Path(fluxon.__file__).parent / "sglang.py").read_text()
    assert "from fluxon.sglang_linker import FluxonLinker" in src and '"FluxonLinker"' in src


def test_our_config_defaults_and_refusals(monkeypatch):
    monkeypatch.delenv("FLUXON_SOCKET", raising=False)
    c = LinkerConfig.from_extra(None)
    assert c.socket == fluxon.DEFAULT_SOCKET_PATH and c.namespace == "sglang"
    monkeypatch.setenv("FLUXON_SOCKET", "/tmp/env.sock")
    assert LinkerConfig.from_extra({}).socket == "/tmp/env.sock"
    for bad in ({"sockett": "/x"}, {"namespace": "a:b"}, {"namespace": ""},
                {"sm_budget": 0}, {"sm_budget": True}, {"lookup_hold_s": -1},
                {"tp_rank": 1}, {"tp_rank": -1, "tp_size": 2}, {"model": 3}, [],
                {"staging_pages": -1}, {"staging_pages": 65}, {"staging_pages": 1.5},
                {"staged_min_pages": 0}, {"copy_streams": 0}, {"copy_streams": 9},
                {"layer_path": "dma"}, {"layer_path": 1},
                {"layer_path": "staged", "staging_pages": 0}, {"deferred_lookup": 1},
                {"deferred_lookup": "yes"}):
        with pytest.raises(fluxon.InvalidArgumentError):
            LinkerConfig.from_extra(bad)
    assert (c.staging_pages, c.staged_min_pages) == (4, 16)
    assert (c.copy_streams, c.layer_path) == (1, "auto")
    forced = LinkerConfig.from_extra({"layer_path": "kernel", "copy_streams": 8})
    assert (forced.copy_streams, forced.layer_path) == (8, "kernel")
    off = LinkerConfig.from_extra({"staging_pages": 0, "staged_min_pages": 1})
    assert (off.staging_pages, off.staged_min_pages) == (0, 1)
    assert c.deferred_lookup is True
    assert LinkerConfig.from_extra({"deferred_lookup": False}).deferred_lookup is False


def test_storage_backend_has_the_0_5_23_hook_and_config():
    hs = _class(_sglang_dir() / "srt/mem_cache/hicache_storage.py", "HiCacheStorage")
    assert "on_host_pools_registered" in {f.name for f in hs.body if isinstance(f, ast.FunctionDef)}
    cfg = _class(_sglang_dir() / "srt/mem_cache/hicache_storage.py", "HiCacheStorageConfig")
    fields = {n.target.id for n in cfg.body if isinstance(n, ast.AnnAssign)}
    assert {"dcp_size", "dcp_rank", "logical_page_size"} <= fields and "dp_size" not in fields
    assert "is_storage_writer" in {f.name for f in cfg.body if isinstance(f, ast.FunctionDef)}
    ours = _class(Path(fluxon.__file__).parent / "sglang.py", "FluxonHiCacheStorage")
    methods = {f.name: f for f in ours.body if isinstance(f, ast.FunctionDef)}
    assert [a.arg for a in methods["on_host_pools_registered"].args.args] == ["self"]
    assert "is_storage_writer" in ast.unparse(methods["__init__"])
    # What the hook checks, on the torch-free core: registration happened.
    b = FluxonHiCacheBackend(storage_config("/x"), {})
    assert b._store is None


# ---- pools and keys ---------------------------------------------------------------------------


@pytest.mark.parametrize("pool,components,name", [
    (SWAKVPool(), ("FULL", "SWA"), "SWAKVPool"),
    (SWAKVPool(), ("FULL",), "SWAKVPool"),
    (HybridLinearKVPool(), ("FULL", "MAMBA"), "HybridLinearKVPool"),
    (HybridLinearKVPool(), ("FULL",), "HybridLinearKVPool"),
])
def test_swa_and_mamba_pools_are_refused_by_name(pool, components, name):
    with pytest.raises(fluxon.InvalidArgumentError, match=name):
        PoolView.of(pool, components)
    calls = []
    with pytest.raises(fluxon.InvalidArgumentError, match=name):
        make(pool, components=components, client_factory=lambda s: calls.append(s))
    assert calls == []  # refused before connecting


def test_head_major_buffers_are_refused():
    pool = MHATokenToKVPool()
    pool.kv_cache_layout = "hnd"
    with pytest.raises(fluxon.InvalidArgumentError, match="hnd"):
        PoolView.of(pool)
    pool.kv_cache_layout = "nhd"
    assert PoolView.of(pool).attention == "mha"


def test_component_enum_members_are_read_by_name():
    class C:
        def __init__(self, name):
            self.name = name
    with pytest.raises(fluxon.InvalidArgumentError, match="SWA"):
        PoolView.of(MHATokenToKVPool(), {C("FULL"), C("SWA")})
    assert PoolView.of(MHATokenToKVPool(), {C("FULL")}).attention == "mha"


def test_value_length_is_the_kernel_layout():
    mha = PoolView.of(MHATokenToKVPool())
    assert mha.value_len == LAYERS * 2 * PAGE * 2 * 8 * 2 and mha.device_pages == 16
    mla = PoolView.of(MLATokenToKVPool())
    assert mla.value_len == LAYERS * PAGE * 24 * 2


def test_keys_use_the_backend_key_function_and_never_meet_its_pages(daemon, sock):
    lk = daemon_linker(sock)
    try:
        ident = RankIdentity(model="org-model-7b", tp_rank=0, tp_size=1)
        view = PoolView.of(MHATokenToKVPool())
        want = KeyScheme.build("sglang", ident, "page", view.geometry_parts())
        h = hashes(1)[0]
        assert lk.storage_key(h) == want.key(h)
        assert lk.storage_key(h).startswith(f"sglang:{h}_") and lk.storage_key(h).endswith("_t0.1")
        assert LINKER_LAYOUT not in SUPPORTED_LAYOUTS
        # The storage backend, same model and rank, any host layout: other keys.
        for layout in ("layer_first", "page_first", "page_first_direct"):
            b = FluxonHiCacheBackend(storage_config(sock), {})
            b.register_mem_pool_host(NumpyHostPool(layout, page_size=PAGE))
            try:
                assert b.storage_key(h) != lk.storage_key(h)
                assert b._ident == ident  # the same identity reaches the same key function
            finally:
                b.close()
    finally:
        lk.close()


def test_keys_follow_rank_pipeline_and_context_parallel(daemon, sock):
    factory = lambda s: fluxon.KvClient(socket_path=sock)  # noqa: E731
    h = hashes(1)[0]
    keys = {}
    for name, pool, extra, p in [
            ("mha0", MHATokenToKVPool(), {"tp_rank": 0, "tp_size": 2}, {}),
            ("mha1", MHATokenToKVPool(), {"tp_rank": 1, "tp_size": 2}, {}),
            ("mla0", MLATokenToKVPool(), {"tp_rank": 0, "tp_size": 2}, {}),
            ("mla1", MLATokenToKVPool(), {"tp_rank": 1, "tp_size": 2}, {}),
            ("pp1", MHATokenToKVPool(), {"tp_rank": 0, "tp_size": 2}, {"pp_rank": 1, "pp_size": 2}),
            ("cp1", MHATokenToKVPool(), {"tp_rank": 0, "tp_size": 2},
             {"attn_cp_rank": 1, "attn_cp_size": 2}),
            ("model", MHATokenToKVPool(), {"tp_rank": 0, "tp_size": 2, "model": "other"}, {}),
            ("heads", MHATokenToKVPool(heads=4, head_dim=4), {"tp_rank": 0, "tp_size": 2}, {})]:
        pr = params(pool)
        for k, v in p.items():
            setattr(pr, k, v)
        lk = FluxonLinker(SERVER_ARGS, pr, components={"FULL"}, extra_config=extra,
                          _ops=FakeOps(), _client_factory=factory)
        keys[name] = (lk.storage_key(h), lk.is_writer)
        lk.close()
    assert keys["mha0"][0].endswith("_t0.2") and keys["mha1"][0].endswith("_t1.2")
    assert keys["mla0"][0] == keys["mla1"][0] and keys["mla0"][0].endswith("_mla")
    assert keys["mla0"][1] and not keys["mla1"][1] and keys["mha1"][1]
    assert len({keys[n][0] for n in ("mha0", "pp1", "cp1", "model", "heads")}) == 5


# ---- flows against a real owner (no bytes move: FakeOps) --------------------------------------


def test_offload_lookup_load_consumes_the_lookup_handle(daemon, sock):
    ops = FakeOps()
    lk = daemon_linker(sock, ops=ops, inline_load_pages=0)  # every batch to the load thread
    try:
        keys = hashes(6)
        assert lk.lookup("r0", kv(keys)) == []
        assert lk.offload(kv(keys[:4], [1, 2, 3, 4])) is True
        assert wait_results(lk, 1) == [True]
        assert ops.writes == [(ops.writes[0][0], (1, 2, 3, 4))]
        # Already stored pages are skipped; the new ones are written.
        assert lk.offload(kv(keys[2:6], [3, 4, 5, 6])) is True
        assert wait_results(lk, 1) == [True] and ops.writes[1][1] == (5, 6)
        assert lk.lookup("r1", kv(keys + ["absent"])) == [1, 2, 3, 4, 5, 6]
        # A partial load (the ranks agreed on 3 pages) consumes the held handle.
        assert lk.load("r1", kv(keys[:3], [9, 10, 11])) is True
        idx = lk.start_layer_wise_loading()
        assert idx >= 0 and lk.finish_layer_wise_loading(idx) is True
        assert sorted(set(layer for layer, _, _ in ops.restores)) == list(range(LAYERS))
        assert all(p == (9, 10, 11) for _, _, p in ops.restores)
        assert not lk._held and lk.start_layer_wise_loading() == -1
        # Nothing pins the pages any more: all of them can be deleted.
        c = fluxon.KvClient(socket_path=sock)
        assert lk.lookup("r2", kv(keys)) == [1, 2, 3, 4, 5, 6]
        assert c.delete_prefix("sglang:") == (0, 6)  # the held handle pins them
        lk.reset()  # cancels it
        assert not lk._held
        assert c.delete_prefix("sglang:") == (6, 0)
        assert lk.lookup("r3", kv(keys)) == []
    finally:
        lk.close()


def test_unclaimed_handles_are_cancelled(daemon, sock):
    lk = daemon_linker(sock, lookup_hold_s=0.2)
    try:
        keys = offloaded_pair(lk, "u")
        assert lk.lookup("a", kv(keys)) == [1, 2]
        assert lk.lookup("a", kv(keys)) == [1, 2]  # the first handle is cancelled
        assert list(lk._held) == ["a"]
        time.sleep(0.3)
        assert lk.lookup("b", kv(hashes(1, "none"))) == []  # sweeps "a"
        assert not lk._held
        # A queued load cancelled before it starts gives its handle back too.
        assert lk.lookup("c", kv(keys)) == [1, 2]
        assert lk.load("c", kv(keys, [3, 4])) and lk.cancel_queued_load("c")
        assert not lk.cancel_queued_load("c")
        assert lk.start_layer_wise_loading() == -1
        c = fluxon.KvClient(socket_path=sock)
        assert c.delete_prefix("sglang:") == (2, 0)  # nothing left pinned
    finally:
        lk.close()


def test_load_of_pages_gone_since_lookup_is_reported(daemon, sock):
    lk = daemon_linker(sock)
    try:
        keys = offloaded_pair(lk, "g")
        assert lk.load("r", kv(keys + ["gone"], [3, 4, 5])) is True  # no lookup handle
        idx = lk.start_layer_wise_loading()
        assert lk.finish_layer_wise_loading(idx) is False
        assert lk.stats["load_failures"] == 1
    finally:
        lk.close()


def test_mla_rank_one_reads_and_never_writes(daemon, sock):
    factory = lambda s: fluxon.KvClient(socket_path=sock)  # noqa: E731
    r0 = make(MLATokenToKVPool(), client_factory=factory, tp_rank=0, tp_size=2)
    ops1 = FakeOps()
    r1 = make(MLATokenToKVPool(), ops=ops1, client_factory=factory, tp_rank=1, tp_size=2)
    try:
        keys = hashes(3, "m")
        assert r1.offload(kv(keys, [1, 2, 3])) is True
        assert wait_results(r1, 1) == [True] and ops1.writes == []
        assert r0.lookup("x", kv(keys)) == []
        r0.offload(kv(keys, [1, 2, 3]))
        assert wait_results(r0, 1) == [True]
        assert r1.lookup("x", kv(keys)) == [1, 2, 3]
        r1.reset()
    finally:
        r0.close()
        r1.close()


def test_daemon_gone_gives_no_hit_and_failed_offloads(daemon, sock):
    lk = daemon_linker(sock)
    try:
        keys = offloaded_pair(lk, "d")
        daemon.stop()
        assert lk.lookup("r", kv(keys)) == []
        assert lk.lookup("r", kv(keys)) == []
        assert lk.offload(kv(hashes(2, "e"), [3, 4])) is True
        assert wait_results(lk, 1) == [False]
        assert lk.load("r", kv(keys, [5, 6])) is True
        assert lk.finish_layer_wise_loading(lk.start_layer_wise_loading()) is False
        assert lk.stats["errors"] >= 1
    finally:
        lk.close()


def test_no_daemon_at_start_is_a_clear_error(tmp_path):
    with pytest.raises(fluxon.FluxonError, match="is fluxond running"):
        make(client_factory=lambda s: fluxon.KvClient(socket_path=str(tmp_path / "none.sock")))


# ---- failure paths with a fake client ---------------------------------------------------------


class Handle:
    def __init__(self, n, deferred=False):
        self.result = SimpleNamespace(transferable_len=n, deferred=deferred)


class FakeClient:
    """Counts calls; `fail` names calls that raise OwnerUnavailableError."""

    def __init__(self, stored=(), fail=(), conflicts=None, deferred=False):
        self.stored, self.fail = set(stored), set(fail)
        self.deferred = deferred
        self.conflicts = conflicts
        self.calls, self.open_handles, self.open_plans = [], 0, 0
        self.lock = threading.Lock()

    def _call(self, name):
        with self.lock:
            self.calls.append(name)
        if name in self.fail:
            raise OwnerUnavailableError(f"{name}: owner gone")

    def get_start(self, keys, **kw):
        self._call("get_start")
        self.get_start_kw = kw
        n = 0
        while n < len(keys) and keys[n] in self.stored:
            n += 1
        self.open_handles += 1
        return Handle(n, self.deferred and kw.get("allow_deferred", False))

    def cancel_get_transfer(self, h):
        self._call("cancel")
        self.open_handles -= 1

    def get_transfer(self, h, consume_prefix_len=None):
        self.open_handles -= 1
        self._call("get_transfer")
        if "get_transfer_fetch" in self.fail:  # a deferred page that could not be fetched
            raise fluxon.FetchFailedError("1 of the consumed values could not be fetched")
        self.open_plans += 1
        return 0x1000

    def release_views(self, p):
        self._call("release_views")
        self.open_plans -= 1

    def local_fast_put_start(self, keys, value_len, opts):
        self._call("put_start")
        bad = [i for i, k in enumerate(keys) if k in self.stored]
        if bad:
            raise KeyConflictError("stored", bad)
        self.last_put = (list(keys), opts.parent_key)
        self.open_plans += 1
        return 0x2000

    def local_fast_put_commit(self, p):
        self._call("commit")
        self.open_plans -= 1
        self.stored.update(self.last_put[0])

    def put_abort(self, p):
        self._call("abort")
        self.open_plans -= 1


def test_fake_owner_failures_never_raise(tmp_path):
    fc = FakeClient(fail={"get_start", "put_start"})
    lk = make(client_factory=lambda s: fc)
    try:
        assert lk.lookup("r", kv(hashes(2))) == []
        assert lk.offload(kv(hashes(2), [1, 2])) is True
        assert wait_results(lk, 1) == [False]
        assert lk.load("r", kv(hashes(2), [1, 2]))
        assert lk.finish_layer_wise_loading(lk.start_layer_wise_loading()) is False
        assert fc.open_handles == 0 and fc.open_plans == 0
        assert lk.stats["reconnects"] >= 1  # every failure dropped the client; calls reconnect
    finally:
        lk.close()


def test_fake_owner_load_failure_releases_views_and_reports(tmp_path):
    fc = FakeClient(stored=hashes(3))

    class FailingOps(FakeOps):
        def restore_layer(self, plane, plan, pages, layer):
            if layer == 1:
                raise RuntimeError("kernel launch failed")
            super().restore_layer(plane, plan, pages, layer)

    lk = make(ops=FailingOps(), client_factory=lambda s: fc, inline_load_pages=0)
    fc.stored = {lk.storage_key(h) for h in hashes(3)}
    try:
        assert lk.lookup("r", kv(hashes(3))) == [1, 2, 3]
        assert lk.load("r", kv(hashes(3), [1, 2, 3]))
        idx = lk.start_layer_wise_loading()
        futures = lk.layer_done_counter.futures[idx]
        assert lk.finish_layer_wise_loading(idx) is False
        assert all(f.exception() is not None for f in futures)  # no layer reported landed
        assert fc.open_handles == 0 and fc.open_plans == 0
        # A load whose slots are not whole pages fails the batch, not the scheduler.
        bad = [SimpleNamespace(name="kv", keys=hashes(1), device_indices=Slots([1, 2, 3, 4]))]
        assert lk.load("q", bad)
        assert lk.finish_layer_wise_loading(lk.start_layer_wise_loading()) is False
        assert fc.open_handles == 0 and fc.open_plans == 0
    finally:
        lk.close()


def test_a_deferred_lookup_whose_pages_cannot_be_fetched_fails_the_load_only(tmp_path):
    """lookup asks for a deferred answer (a remote read never holds the scheduler); a page that
    then cannot be fetched fails that load (its layers report failure), and nothing stays open."""
    fc = FakeClient(fail={"get_transfer_fetch"})
    lk = make(client_factory=lambda s: fc)
    fc.stored = {lk.storage_key(h) for h in hashes(2)}
    try:
        assert lk.lookup("r", kv(hashes(2))) == [1, 2]
        assert fc.get_start_kw.get("allow_deferred") is True
        assert lk.load("r", kv(hashes(2), [1, 2]))
        assert lk.finish_layer_wise_loading(lk.start_layer_wise_loading()) is False
        assert fc.open_handles == 0 and fc.open_plans == 0
        # The next lookup still works (a failed fetch is not a lost owner).
        fc.fail = set()
        assert lk.lookup("q", kv(hashes(2))) == [1, 2]
    finally:
        lk.close()


def test_a_small_local_load_is_enqueued_by_start_and_the_forward_waits_on_the_device(daemon,
                                                                                      sock):
    """A batch of at most inline_load_pages pages whose lookup handles are local is enqueued by
    start_layer_wise_loading itself (one restore of every layer per load, no load thread, no
    per-layer launch): every wait_until is a device-side wait on the batch's event, finish
    gives the verdict and the views back."""
    ops = FakeOps()
    lk = daemon_linker(sock, ops=ops)
    try:
        keys = hashes(4)
        assert lk.offload(kv(keys, [1, 2, 3, 4])) is True
        assert wait_results(lk, 1) == [True]
        assert lk.lookup("a", kv(keys[:2])) == [1, 2]
        assert lk.lookup("b", kv(keys[2:])) == [1, 2]
        assert lk.load("a", kv(keys[:2], [9, 10])) and lk.load("b", kv(keys[2:], [11, 12]))
        idx = lk.start_layer_wise_loading()
        assert idx >= 0 and lk.stats["load_inline"] == 2
        assert [p for _, p in ops.inline] == [(9, 10), (11, 12)] and ops.restores == []
        counter = lk.layer_done_counter
        counter.set_consumer(idx)
        for layer in range(LAYERS):
            counter.wait_until(layer)  # returns at once: the stream waits, not the host
        assert ops.events[-1].waits == LAYERS  # the batch's one event (the first: the offload)
        c = fluxon.KvClient(socket_path=sock)
        assert c.delete_prefix("sglang:") == (0, 4)  # the views pin the pages until finish
        assert lk.finish_layer_wise_loading(idx) is True
        counter.set_consumer(-1)
        assert lk.stats["load_pages"] == 4 and lk.stats["load_failures"] == 0
        assert c.delete_prefix("sglang:") == (4, 0)  # nothing left pinned
    finally:
        lk.close()


def test_loads_that_are_large_deferred_or_without_a_lookup_go_to_the_load_thread(tmp_path):
    """Inline only when small and every handle is local: more pages than inline_load_pages, a
    deferred lookup (its get_transfer may wait for a remote read: never on the scheduler's
    thread), a load with no lookup handle, or inline_load_pages 0 go to the load thread."""
    def run(pages, fc, lookup=True, **extra):
        ops = FakeOps()
        lk = make(ops=ops, client_factory=lambda s: fc, **extra)
        fc.stored = {lk.storage_key(h) for h in hashes(pages)}
        try:
            if lookup:
                assert lk.lookup("r", kv(hashes(pages))) == list(range(1, pages + 1))
            assert lk.load("r", kv(hashes(pages), list(range(pages))))
            assert lk.finish_layer_wise_loading(lk.start_layer_wise_loading()) is True
            assert fc.open_handles == 0 and fc.open_plans == 0
            return lk.stats["load_inline"], sum(len(p) for _, p in ops.inline), len(ops.restores)
        finally:
            lk.close()

    assert run(4, FakeClient()) == (1, 4, 0)  # the default: 4 pages inline
    assert run(5, FakeClient()) == (0, 0, LAYERS)
    assert run(8, FakeClient(), inline_load_pages=8) == (1, 8, 0)
    assert run(1, FakeClient(), inline_load_pages=0) == (0, 0, LAYERS)
    assert run(2, FakeClient(deferred=True)) == (0, 0, LAYERS)
    assert run(2, FakeClient(), lookup=False) == (0, 0, LAYERS)
    with pytest.raises(fluxon.InvalidArgumentError, match="inline_load_pages"):
        LinkerConfig.from_extra({"inline_load_pages": 65})
    with pytest.raises(fluxon.InvalidArgumentError, match="inline_load_pages"):
        LinkerConfig.from_extra({"inline_load_pages": -1})


def test_one_unfinished_inline_load_batch_at_a_time(tmp_path):
    """A batch started while an inline one is not finished (overlap scheduling) goes to the load
    thread: one plane's error word then always names the copies of the batch that checks it."""
    fc = FakeClient()
    ops = FakeOps()
    lk = make(ops=ops, client_factory=lambda s: fc)
    fc.stored = {lk.storage_key(h) for h in hashes(2)}
    try:
        for rid in ("a", "b"):
            assert lk.lookup(rid, kv(hashes(2))) == [1, 2]
        assert lk.load("a", kv(hashes(2), [1, 2]))
        first = lk.start_layer_wise_loading()
        assert lk.load("b", kv(hashes(2), [3, 4]))
        second = lk.start_layer_wise_loading()
        assert lk.finish_layer_wise_loading(second) is True
        assert lk.stats["load_inline"] == 1 and len(ops.restores) == LAYERS
        assert lk.finish_layer_wise_loading(first) is True
        assert fc.open_handles == 0 and fc.open_plans == 0
    finally:
        lk.close()


def test_an_inline_batch_never_finished_gives_its_views_back_two_batches_later(tmp_path):
    """SGLang finishes a batch before it starts the third after it: an inline batch still
    unfinished by then was dropped by its caller, and its views must not stay pinned."""
    fc = FakeClient()
    lk = make(client_factory=lambda s: fc)
    fc.stored = {lk.storage_key(h) for h in hashes(1)}
    try:
        idx = []
        for i in range(3):
            assert lk.lookup(f"r{i}", kv(hashes(1))) == [1]
            assert lk.load(f"r{i}", kv(hashes(1), [i]))
            idx.append(lk.start_layer_wise_loading())
            if i > 0:  # the first batch (inline) is never finished by its caller
                assert lk.finish_layer_wise_loading(idx[-1]) is True
        assert lk.stats["load_inline"] == 1  # the first, never finished, kept the others out
        assert lk.lookup("r3", kv(hashes(1))) == [1]
        assert lk.load("r3", kv(hashes(1), [3]))
        last = lk.start_layer_wise_loading()  # two batches on: the first one's views go back
        assert lk.stats["load_inline"] == 2
        assert lk.finish_layer_wise_loading(last) is True
        assert fc.open_handles == 0 and fc.open_plans == 0
    finally:
        lk.close()


def test_an_inline_load_that_fails_is_reported_by_finish_and_releases_its_views(tmp_path):
    fc = FakeClient()

    class FailingOps(FakeOps):
        def restore_all(self, plane, work):
            raise RuntimeError("kernel launch failed")

    class BadEvent(Event):
        def synchronize(self):
            raise RuntimeError("an illegal address was encountered")

    class LateFailingOps(FakeOps):
        def restore_all(self, plane, work):
            super().restore_all(plane, work)
            self.events[-1] = BadEvent()
            return self.events[-1]

    for ops in (FailingOps(), LateFailingOps()):
        lk = make(ops=ops, client_factory=lambda s: fc)
        fc.stored = {lk.storage_key(h) for h in hashes(2)}
        try:
            assert lk.lookup("r", kv(hashes(2))) == [1, 2]
            assert lk.load("r", kv(hashes(2), [1, 2]))
            idx = lk.start_layer_wise_loading()
            assert lk.stats["load_inline"] == 1
            lk.layer_done_counter.set_consumer(idx)
            lk.layer_done_counter.wait_until(LAYERS - 1)  # never blocks, even when failed
            assert lk.finish_layer_wise_loading(idx) is False
            assert lk.stats["load_failures"] == 1 and lk.stats["load_pages"] == 0
            assert fc.open_handles == 0 and fc.open_plans == 0
        finally:
            lk.close()


def test_reset_gives_back_the_views_of_inline_loads_nobody_finished(tmp_path):
    fc = FakeClient()
    lk = make(client_factory=lambda s: fc)
    fc.stored = {lk.storage_key(h) for h in hashes(2)}
    try:
        assert lk.lookup("r", kv(hashes(2))) == [1, 2]
        assert lk.load("r", kv(hashes(2), [1, 2]))
        idx = lk.start_layer_wise_loading()
        assert lk.stats["load_inline"] == 1 and fc.open_plans == 1
        lk.reset()
        assert fc.open_handles == 0 and fc.open_plans == 0
        assert lk.finish_layer_wise_loading(idx) is True  # nothing left of it: no wait
    finally:
        lk.close()


def test_offload_skips_stored_pages_and_passes_the_parent(tmp_path):
    fc = FakeClient()
    ops = FakeOps()
    lk = make(ops=ops, client_factory=lambda s: fc)
    try:
        keys = hashes(5)
        stored = [lk.storage_key(k) for k in keys]
        fc.stored = {stored[0], stored[1]}
        lk.lookup("r", kv(keys))  # the prompt's page chain: parent links learned
        assert lk.offload(kv(keys[2:], [3, 4, 5]))
        assert wait_results(lk, 1) == [True]
        assert fc.last_put == (stored[2:], stored[1])
        fc.stored.add(stored[3])  # another writer stored page 3 meanwhile
        fc.stored.discard(stored[4])
        assert lk.offload(kv(keys[3:], [4, 5]))
        assert wait_results(lk, 1) == [True]
        assert fc.last_put == ([stored[4]], stored[3]) and ops.writes[-1][1] == (5,)
        assert fc.open_plans == 0
    finally:
        lk.close()


def test_write_failure_aborts_the_plan():
    fc = FakeClient()

    class FailingOps(FakeOps):
        def write(self, *a):
            raise RuntimeError("write kernel failed")

    lk = make(ops=FailingOps(), client_factory=lambda s: fc, inline_offload_pages=0)
    try:
        assert lk.offload(kv(hashes(2), [1, 2]))
        assert wait_results(lk, 1) == [False]
        assert "abort" in fc.calls and "commit" not in fc.calls and fc.open_plans == 0
        assert lk.offload([SimpleNamespace(name="swa", keys=hashes(1),
                                           device_indices=slots([1]))]) is False
    finally:
        lk.close()


def test_a_small_offload_is_written_by_the_caller_and_committed_when_polled(daemon, sock):
    """An offload of at most inline_offload_pages pages is reserved and its write enqueued by
    offload() itself; num_completed_offloads() commits it once the write finished (no offload
    thread on either side), and the pages are then stored."""
    ops = FakeOps()
    lk = daemon_linker(sock, ops=ops)
    try:
        keys = hashes(3, "in")
        assert lk.offload(kv(keys, [1, 2, 3])) is True
        assert lk.stats["offload_inline"] == 1 and ops.writes[-1][1] == (1, 2, 3)
        ops.events[-1].done = False  # the write still runs: not committed, not completed
        assert lk.num_completed_offloads() == 0
        assert lk.lookup("r", kv(keys)) == []
        ops.events[-1].done = True
        assert lk.num_completed_offloads() == 1 and lk.pop_completed_offload() is True
        assert lk.lookup("r", kv(keys)) == [1, 2, 3]
        assert lk.stats["offload_pages"] == 3 and lk.stats["offload_failures"] == 0
        # Stored already: decided at once, nothing written.
        writes = len(ops.writes)
        assert lk.offload(kv(keys, [4, 5, 6])) is True and len(ops.writes) == writes
        assert wait_results(lk, 1) == [True]
    finally:
        lk.close()


def test_offload_verdicts_keep_their_order_across_inline_and_threaded_offloads(tmp_path):
    """SGLang pairs verdicts with its offloads by position: an inline offload still writing
    holds back the verdict of a later offload the thread already finished."""
    fc = FakeClient()
    ops = FakeOps()
    lk = make(ops=ops, client_factory=lambda s: fc)
    try:
        assert lk.offload(kv(hashes(1, "a"), [1]))  # inline
        ops.events[-1].done = False
        assert lk.offload(kv(hashes(1, "b"), [2]))  # an inline one is in flight: the thread
        assert lk.offload(kv(hashes(6, "c"), [3, 4, 5, 6, 7, 8]))  # large: the thread
        assert lk.stats["offload_inline"] == 1
        deadline = time.time() + 10
        while lk.stats["offload"] < 2:
            assert time.time() < deadline
            time.sleep(0.01)
        assert lk.num_completed_offloads() == 0  # the first one's write still runs
        with pytest.raises(Exception):
            lk.pop_completed_offload()
        ops.events[-1].done = True
        assert wait_results(lk, 3) == [True, True, True]
        assert fc.open_plans == 0
    finally:
        lk.close()


def test_an_inline_offload_that_fails_is_aborted_and_reported_in_order(tmp_path):
    fc = FakeClient()

    class FailingOps(FakeOps):
        def write_inline(self, *a):
            raise RuntimeError("write kernel failed")

    class BadEvent(Event):
        def synchronize(self):
            raise RuntimeError("an illegal address was encountered")

    class LateFailingOps(FakeOps):
        def write_inline(self, *a):
            super().write_inline(*a)
            self.events[-1] = BadEvent()
            return self.events[-1]

    class StuckStreamOps(FailingOps):
        def drain_inline(self, offload=False):
            raise RuntimeError("the stream cannot be synchronised")

    for ops in (FailingOps(), LateFailingOps(), StuckStreamOps()):
        lk = make(ops=ops, client_factory=lambda s: fc)
        try:
            assert lk.offload(kv(hashes(2, type(ops).__name__), [1, 2])) is True
            assert wait_results(lk, 1) == [False]
            assert "abort" in fc.calls and "commit" not in fc.calls and fc.open_plans == 0
            assert lk.stats["offload_inline"] == 1 and lk.stats["offload_failures"] == 1
        finally:
            lk.close()
        fc.calls.clear()


def test_reset_commits_or_aborts_an_inline_offload_in_flight(tmp_path):
    fc = FakeClient()
    ops = FakeOps()
    lk = make(ops=ops, client_factory=lambda s: fc)
    try:
        assert lk.offload(kv(hashes(2, "r"), [1, 2]))
        assert fc.open_plans == 1
        lk.reset()  # waits for the write (done), commits, drops the verdict
        assert fc.open_plans == 0 and "commit" in fc.calls and lk.num_completed_offloads() == 0
    finally:
        lk.close()


def test_reset_and_close_quiesce_and_release():
    fc = FakeClient()
    lk = make(client_factory=lambda s: fc)
    fc.stored = {lk.storage_key(h) for h in hashes(4)}
    lk.lookup("a", kv(hashes(4)))
    lk.lookup("b", kv(hashes(2)))
    lk.load("b", kv(hashes(2), [1, 2]))
    for i in range(3):
        lk.offload(kv(hashes(1, f"o{i}"), [i + 1]))
    lk.reset()
    assert lk.num_completed_offloads() == 0 and fc.open_handles == 0 and fc.open_plans == 0
    assert lk.start_layer_wise_loading() == -1
    lk.lookup("c", kv(hashes(4)))
    lk.close()
    lk.close()  # idempotent
    assert fc.open_handles == 0 and not lk._load_thread.is_alive()
    assert not lk._offload_thread.is_alive()


def test_token_slots_must_be_whole_pages():
    assert pages_from_token_slots(list(slots([3, 1, 7])), PAGE, 16) == [3, 1, 7]
    for bad in ([], [1, 2, 3, 4], [4, 5, 6, 8], list(slots([16])), [4, 5, 6]):
        with pytest.raises(fluxon.InvalidArgumentError):
            pages_from_token_slots(bad, PAGE, 16)


def test_layer_path_by_batch_size():
    """Loads of staged_min_pages pages or more take the staged copy-engine path; smaller ones the
    one-layer kernel; layer_path forces either; no staging buffer means the kernel."""
    def path(extra, pages):
        ops = CudaOps.__new__(CudaOps)  # the path choice needs only the config, not CUDA
        ops.config = LinkerConfig.from_extra(extra)
        return ops.layer_path(pages)

    assert path({}, 15) == "kernel" and path({}, 16) == "staged" and path({}, 128) == "staged"
    assert path({"staged_min_pages": 4}, 4) == "staged"
    assert path({"staging_pages": 0}, 128) == "kernel"
    assert path({"layer_path": "kernel"}, 128) == "kernel"
    assert path({"layer_path": "staged"}, 1) == "staged"


def test_kernels_by_token_slots_get_exactly_their_pages_slots():
    # The inline kernels read n * page_size token slots through a raw pointer: a slot tensor of
    # another length must be refused before any launch, never read past its end.
    class SlotTensor:
        def __init__(self, n):
            self.n = n

        def numel(self):
            return self.n

        def data_ptr(self):
            return 0x1000

        def element_size(self):
            return 8

    ops = SimpleNamespace(view=SimpleNamespace(page_size=PAGE))
    assert CudaOps._slot_args(ops, SlotTensor(2 * PAGE), 2) == dict(
        token_slots_ptr=0x1000, token_slot_bytes=8, page_size=PAGE)
    for wrong in (PAGE, 2 * PAGE - 1, 3 * PAGE):
        with pytest.raises(InvalidArgumentError, match="token slots for 2 pages"):
            CudaOps._slot_args(ops, SlotTensor(wrong), 2)
