"""fluxon.sglang against the real SGLang package (pinned: sglang==0.5.23, installed --no-deps).

* The interface checks read SGLang's own source (no import: importing it needs torch), so they
  run wherever the sglang wheel is installed.
* The factory test imports SGLang and loads our class through StorageBackendFactory's dynamic
  path; it needs torch, which PyPI only serves as the CUDA build (its CUDA runtime libraries are
  several GB), so it is skipped where torch cannot be imported here; tests/gpu/test_sglang_real.py
  does the same and more with real host pools on the GPU machine (scripts/gpu-run.sh).
"""

import ast
import importlib.util
import inspect
from pathlib import Path

import numpy as np
import pytest

from fluxon.hicache import FluxonHiCacheBackend
from hostpool import NumpyHostPool
from test_hicache import hashes, host_indices, storage_config

PINNED = "0.5.23"


def _sglang_dir() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed (scripts/install-deps.sh installs it)")
    return Path(list(spec.submodule_search_locations)[0])


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"{name} not found in {path}")


def test_pinned_release_is_installed():
    from importlib.metadata import version
    _sglang_dir()
    assert version("sglang") == PINNED


def test_backend_implements_every_hicache_storage_method_with_sglang_signatures():
    cls = _class(_sglang_dir() / "srt/mem_cache/hicache_storage.py", "HiCacheStorage")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    abstract = {n for n, f in methods.items()
                if any(getattr(d, "id", getattr(d, "attr", None)) == "abstractmethod"
                       for d in f.decorator_list)}
    assert abstract == {"get", "batch_get", "set", "batch_set", "exists"}
    needed = abstract | {"register_mem_pool_host", "batch_exists", "batch_get_v1",
                         "batch_set_v1", "clear", "get_stats"}
    for name in sorted(needed):
        theirs = [a.arg for a in methods[name].args.args]
        ours = list(inspect.signature(getattr(FluxonHiCacheBackend, name)).parameters)
        assert ours == theirs, (name, ours, theirs)
    assert callable(FluxonHiCacheBackend.close)


def test_test_config_mirrors_hicache_storage_config():
    cls = _class(_sglang_dir() / "srt/mem_cache/hicache_storage.py", "HiCacheStorageConfig")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    assert fields == set(vars(storage_config("/x")))


def test_dynamic_factory_calls_the_constructor_the_way_we_accept():
    src = (_sglang_dir() / "srt/mem_cache/storage/backend_factory.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src))
              if isinstance(n, ast.FunctionDef) and n.name == "_create_dynamic_backend")
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)
             and getattr(c.func, "id", None) == "backend_class"]
    assert len(calls) == 1 and len(calls[0].args) == 2 and not calls[0].keywords
    for f in ("backend_name", "module_path", "class_name"):
        assert repr(f) in ast.unparse(fn)
    inspect.signature(FluxonHiCacheBackend).bind(object(), {})


def test_host_pool_page_meta_matches_the_stand_in():
    """The stand-in pool's pointer formulas are SGLang's: same layouts, same entries per page."""
    mha = _class(_sglang_dir() / "srt/mem_cache/pool_host/mha.py", "MHATokenToKVPoolHost")
    meta = next(f for f in mha.body
                if isinstance(f, ast.FunctionDef) and f.name == "get_page_buffer_meta")
    text = ast.unparse(meta)
    assert "self.layout == 'layer_first'" in text
    assert "['page_first', 'page_first_direct', 'page_head']" in text
    assert text.count("ptr_list.append(k_ptr)") == 2 and text.count("ptr_list.append(v_ptr)") == 2


def test_factory_loads_and_runs_our_class(daemon, sock):
    _sglang_dir()
    pytest.importorskip("torch", reason="importing SGLang's storage modules needs torch")
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    import fluxon.sglang

    extra = {"backend_name": "fluxon", "module_path": "fluxon.sglang",
             "class_name": "FluxonHiCacheStorage", "interface_v1": 1, "socket": sock}
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=True,
                               is_page_first_layout=True, model_name="m", extra_config=extra)
    b = StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert isinstance(b, fluxon.sglang.FluxonHiCacheStorage) and isinstance(b, HiCacheStorage)
    pool = NumpyHostPool("page_first")
    pool.fill_page(0, np.random.default_rng(0))
    b.register_mem_pool_host(pool)
    assert b.batch_set_v1(hashes(1), host_indices(pool, [0])) == [True]
    assert b.batch_get_v1(hashes(1), host_indices(pool, [1])) == [True]
    assert np.array_equal(pool.page(4), pool.page(0))
    assert type(b.get_stats()).__name__ == "StorageMetrics"
