"""fluxon.sglang inside the real SGLang package (pinned: sglang==0.5.23) with real host KV pools.

Runs where torch is importable (the GPU machine; `scripts/gpu-run.sh` step `sglang`):

* SGLang's own StorageBackendFactory loads FluxonHiCacheStorage through the dynamic path with
  the extra-config users pass on the command line;
* real device pools (MHATokenToKVPool / MLATokenToKVPool on CUDA) and the host pools SGLang builds
  from them (its own `_build_mha_mla_host_pool`) round-trip pages through batch_set_v1 /
  batch_exists / batch_get_v1 byte-exact, for every layout SGLang can build, and through the
  legacy byte methods (set / get / batch_set / batch_get / exists) with SGLang's own page tensors;
* pages written under one layout miss under every other (same key strings, same namespace);
* MLA: TP rank 0 writes, rank 1 writes nothing and reads rank 0's pages;
* clear() deletes every page of the backend's namespace;
* bad input is refused at registration with a clear error (page-size mismatch, no daemon).

Usage: FLUXOND=path/to/fluxond python3 tests/gpu/test_sglang_real.py
Prints a table and "N passed, N failed"; exits 0 only when every check passed.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import fluxon
from fluxon.hicache import SUPPORTED_LAYOUTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_harness import Checks, start_daemon, stop_daemon  # noqa: E402

PAGE = 16
PAGES = 8


class NotBuilt(Exception):
    """SGLang itself does not build this pool (layout not offered for this attention kind)."""


check = Checks(not_applicable=(NotBuilt,))


def storage_config(extra, *, mla, tp_rank=0, tp_size=1, page_first=False):
    """HiCacheStorageConfig built defensively: only the fields this SGLang release has."""
    wanted = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                  attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=True,
                  is_page_first_layout=page_first, model_name="fluxon-test/tiny",
                  extra_config=extra)
    names = {f.name for f in dataclasses.fields(HiCacheStorageConfig)}
    return HiCacheStorageConfig(**{k: v for k, v in wanted.items() if k in names})


def extra_config(sock, **more):
    return {"backend_name": "fluxon", "module_path": "fluxon.sglang",
            "class_name": "FluxonHiCacheStorage", "interface_v1": 1, "socket": sock,
            "namespace": "sglang-real", **more}


def device_pool(mla):
    # Host pools are sized (>= 64 MiB) so that their buffers are mmap-backed: a smaller one can
    # come from the heap and share a page with memory CUDA already registered, which SGLang's
    # cudaHostRegister refuses.
    if mla:
        return MLATokenToKVPool(size=1024, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=512,
                                qk_rope_head_dim=64, layer_num=4, device="cuda",
                                enable_memory_saver=False, start_layer=0, end_layer=4)
    return MHATokenToKVPool(size=1024, page_size=PAGE, dtype=torch.bfloat16, head_num=8,
                            head_dim=128, layer_num=4, device="cuda", enable_memory_saver=False,
                            start_layer=0, end_layer=4)


class HostPool:
    """A host pool SGLang builds from a device pool, unregistered (destroy()) on exit: SGLang
    does not unregister on garbage collection, and a later pool mapped at the same address would
    then fail its cudaHostRegister."""

    def __init__(self, mla, layout):
        from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import (
            _build_mha_mla_host_pool)
        self.dev = device_pool(mla)
        try:
            self.pool = _build_mha_mla_host_pool(
                pool=self.dev, host_to_device_ratio=16.0, page_size=PAGE, layout=layout,
                allocator_type="default", pool_label="kv")
        except (ValueError, NotImplementedError, AssertionError) as e:
            raise NotBuilt(e) from e

    def __enter__(self):
        return self.pool

    def __exit__(self, *exc):
        destroy = getattr(self.pool, "destroy", None)
        if callable(destroy):
            destroy()
        self.pool = self.dev = None


def host_buffers(pool):
    bufs = pool.kv_buffer if isinstance(pool.kv_buffer, (list, tuple)) else [pool.kv_buffer]
    return [b for b in bufs if isinstance(b, torch.Tensor)]


def page_bytes(pool, index):
    return pool.get_data_page(index, flat=True).contiguous().view(torch.uint8).clone()


def indices(first_page):
    return torch.arange(first_page * PAGE, (first_page + PAGES) * PAGE, dtype=torch.int64)


def load(sock, pool, *, mla, **cfg_kw):
    cfg = storage_config(extra_config(sock), mla=mla,
                         page_first=pool.layout != "layer_first", **cfg_kw)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    assert isinstance(backend, HiCacheStorage), type(backend)
    assert type(backend).__name__ == "FluxonHiCacheStorage"
    backend.register_mem_pool_host(pool)
    return backend


def round_trip(sock, mla, layout, keys):
    with HostPool(mla, layout) as pool:
        return _round_trip(sock, mla, pool, keys)


def _round_trip(sock, mla, pool, keys):
    backend = load(sock, pool, mla=mla)
    try:
        for b in host_buffers(pool):
            b.view(torch.uint8).random_(0, 256)
        src, dst = indices(1), indices(1 + PAGES)
        want = [page_bytes(pool, int(i)) for i in src[::PAGE]]
        # Same key strings were written by the cases before this one, under other layouts or
        # attention kinds: they must miss here.
        assert backend.batch_exists(keys) == 0, "a page written under another layout is visible"
        assert all(backend.batch_set_v1(keys, src))
        assert backend.batch_exists(keys) == PAGES
        assert backend.batch_exists(keys[:3] + ["absent-page"] + keys[3:]) == 3  # leading prefix
        for b in host_buffers(pool):
            b.zero_()
        got = backend.batch_get_v1(keys, dst)
        assert got == [True] * PAGES, got
        for n, i in enumerate(dst[::PAGE]):
            assert torch.equal(page_bytes(pool, int(i)), want[n]), f"page {n} differs"
        # A partial hit fills the prefix and reports it.
        mixed = keys[:2] + ["absent-page"]
        got = backend.batch_get_v1(mixed, indices(1 + 2 * PAGES)[: 3 * PAGE])
        assert got[:2] == [True, True] and got[2] is False, got
        # Legacy byte methods with SGLang's own flat page tensors (draft pools use them); their
        # values are flat pages, keyed apart from the zero-copy pages.
        legacy_keys = [f"legacy-{k}" for k in keys[:2]]
        pages = [pool.get_data_page(int(i), flat=True).clone() for i in dst[: 2 * PAGE : PAGE]]
        assert not backend.exists(legacy_keys[0])
        assert backend.batch_set(legacy_keys, pages)
        assert backend.exists(legacy_keys[0]) and backend.exists(legacy_keys[1])
        out = backend.get(legacy_keys[0], pool.get_dummy_flat_data_page())
        assert out is not None and torch.equal(out.view(torch.uint8), pages[0].view(torch.uint8))
        outs = backend.batch_get(legacy_keys, [pool.get_dummy_flat_data_page() for _ in pages])
        assert all(o is not None and torch.equal(o.view(torch.uint8), p.view(torch.uint8))
                   for o, p in zip(outs, pages))
        assert backend.set(f"legacy-one-{keys[0]}", pages[1])
        assert torch.equal(backend.get(f"legacy-one-{keys[0]}").view(torch.uint8),
                           pages[1].view(torch.uint8))
        stats = backend.get_stats()
        # StorageMetrics holds one entry per call since the last get_stats.
        assert stats is not None and sum(stats.backup_pgs) >= PAGES, stats
        assert sum(stats.prefetch_pgs) >= PAGES and all(b > 0 for b in stats.backup_bandwidth)
        if mla:
            # Rank-replicated KV: rank 1 of 2 reads rank 0's pages under the same keys and
            # writes nothing.
            other = load(sock, pool, mla=True, tp_rank=1, tp_size=2)
            try:
                assert other.batch_exists(keys) == PAGES
                fresh = [f"rank1-{k}" for k in keys[:2]]
                other.batch_set_v1(fresh, src[: 2 * PAGE])
                assert backend.batch_exists(fresh) == 0, "TP rank 1 wrote an MLA page"
                for b in host_buffers(pool):
                    b.zero_()
                assert other.batch_get_v1(keys, dst) == [True] * PAGES
                for n, i in enumerate(dst[::PAGE]):
                    assert torch.equal(page_bytes(pool, int(i)), want[n])
            finally:
                other.close()
        return f"{sum(t.numel() for t in want) // PAGES} B/page"
    finally:
        backend.close()


def rejects(fn_expect):
    def run():
        try:
            fn_expect()
        except fluxon.FluxonError as e:
            return f"{type(e).__name__}: {str(e)[:60]}"
        raise AssertionError("accepted")
    return run


def main():
    tmp = tempfile.mkdtemp(prefix="fluxon-sglang-")
    proc, sock = start_daemon(tmp)
    try:
        keys = [f"{i:064x}" for i in range(PAGES)]
        for mla in (False, True):
            for layout in SUPPORTED_LAYOUTS:
                check(f"{'MLA' if mla else 'MHA'} {layout}",
                      lambda: round_trip(sock, mla, layout, keys))

        def mismatched_page_size():
            with HostPool(False, "page_first") as pool:
                cfg = storage_config(extra_config(sock, page_size=PAGE * 2), mla=False)
                StorageBackendFactory.create_backend("dynamic", cfg, pool).register_mem_pool_host(
                    pool)

        def no_daemon():
            with HostPool(False, "page_first") as pool:
                cfg = storage_config(extra_config(os.path.join(tmp, "nobody.sock")), mla=False)
                StorageBackendFactory.create_backend("dynamic", cfg, pool).register_mem_pool_host(
                    pool)

        def clear_empties_the_namespace():
            with HostPool(False, "page_first") as pool:
                backend = load(sock, pool, mla=False)
                try:
                    assert backend.batch_exists(keys) == PAGES  # the page_first case's pages
                    backend.clear()
                    assert backend.batch_exists(keys) == 0
                finally:
                    backend.close()
            with HostPool(True, "page_first") as pool:  # every layout and rank of it
                backend = load(sock, pool, mla=True)
                try:
                    assert backend.batch_exists(keys) == 0
                finally:
                    backend.close()

        check("clear() empties the namespace", clear_empties_the_namespace)
        check("page-size mismatch refused", rejects(mismatched_page_size))
        check("no daemon refused", rejects(no_daemon))
    finally:
        stop_daemon(proc, tmp)

    import sglang
    return check.report(f"fluxon.sglang in real SGLang {getattr(sglang, '__version__', '?')}, torch "
                        f"{torch.__version__}")


if __name__ == "__main__":
    sys.exit(main())
