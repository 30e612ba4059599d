"""fluxon.sglang_linker.FluxonLinker inside the real SGLang (pinned: sglang==0.5.23) on CUDA.

Runs where torch and a GPU are (the GPU machine; `scripts/gpu-run.sh` step `linker`):

* SGLang's own `create_unified_cache_linker(..., backend="dynamic", ...)` builds the linker from
  the launch config users pass, over real device pools (MHATokenToKVPool / MLATokenToKVPool on
  CUDA) and SGLang's paged allocator, with the layer counter registered on the pool as SGLang's
  registry does;
* driven as UnifiedCacheLinkerWrapper drives it: offload -> num_completed/pop -> lookup -> load
  into other, poisoned device slots -> start_layer_wise_loading -> the forward's per-layer
  ``get_key_buffer`` waits -> finish_layer_wise_loading; every layer byte-exact, and each layer
  already complete when its wait returns (checked at that moment);
* partial hits; pages already stored are skipped; pages of the HiCache storage backend's keys
  are not visible;
* MLA: TP rank 0 writes, rank 1 writes nothing and restores rank 0's pages;
* two processes on one owner: a child process restores what this one offloaded;
* pages deleted under a queued load and a killed owner: failed loads and offloads, no hits,
  never an exception;
* SWA components are refused; the HiCache backend's on_host_pools_registered hook.

Usage: FLUXOND=path/to/fluxond python3 tests/gpu/test_linker_real.py
Prints a table and "N passed, N failed"; exits 0 only when every check passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

import fluxon
from fluxon.sglang_linker import FluxonLinker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_harness import Checks, start_daemon, stop_daemon  # noqa: E402

PAGE = 16
PAGES = 8
LAYERS = 4
SIZE = 4096
check = Checks()


def device_pool(mla):
    if mla:
        return MLATokenToKVPool(size=SIZE, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=512,
                                qk_rope_head_dim=64, layer_num=LAYERS, device="cuda",
                                enable_memory_saver=False, start_layer=0, end_layer=LAYERS)
    return MHATokenToKVPool(size=SIZE, page_size=PAGE, dtype=torch.bfloat16, head_num=8,
                            head_dim=128, layer_num=LAYERS, device="cuda",
                            enable_memory_saver=False, start_layer=0, end_layer=LAYERS)


def buffers(pool):
    if isinstance(pool, MLATokenToKVPool):
        return list(pool.kv_buffer)
    return list(pool.k_buffer) + list(pool.v_buffer)


def layer_buffers(pool, layer):
    if isinstance(pool, MLATokenToKVPool):
        return [pool.kv_buffer[layer]]
    return [pool.k_buffer[layer], pool.v_buffer[layer]]


class Rig:
    """A device pool, its allocator and a linker built by SGLang's factory."""

    def __init__(self, sock, mla, tp_rank=0, tp_size=1, namespace="linker-real",
                 components=(ComponentType.FULL,), **extra):
        self.mla = mla
        self.pool = device_pool(mla)
        self.alloc = PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.bfloat16, "cuda",
                                                 kvcache=self.pool, need_sort=False)
        params = CacheInitParams(disable=False, req_to_token_pool=None,
                                 token_to_kv_pool_allocator=self.alloc, page_size=PAGE)
        server_args = SimpleNamespace(model_path="fluxon-test/tiny", served_model_name=None,
                                      tp_size=tp_size, enable_linker_mla_dedup=False)
        self.forward_stream = torch.cuda.Stream()
        config = {"linker": "FluxonLinker", "linker_module_path": "fluxon.sglang_linker",
                  "linker_extra_config": {"socket": sock, "namespace": namespace,
                                          "tp_rank": tp_rank, "tp_size": tp_size, **extra}}
        self.linker = create_unified_cache_linker(
            server_args, params, backend="dynamic", config=config, components=set(components),
            forward_stream=self.forward_stream)
        assert isinstance(self.linker, UnifiedCacheLinker)
        assert isinstance(self.linker, FluxonLinker)
        # As SGLang's registry does: the forward waits on the counter per layer.
        self.pool.register_layer_transfer_counter(self.linker.layer_done_counter)
        for b in buffers(self.pool):
            b.view(torch.uint8).random_(0, 256)

    def slots(self, pages):
        s = self.alloc.alloc(pages * PAGE)
        assert s is not None
        return s

    def rows(self, slots):
        """Every layer's rows at `slots` (a list of uint8 tensors, cloned)."""
        return [b[slots].view(torch.uint8).clone() for layer in range(LAYERS)
                for b in layer_buffers(self.pool, layer)]

    def poison(self, slots):
        for b in buffers(self.pool):
            b.view(torch.uint8)[slots] = 0xAB
        torch.cuda.synchronize()

    def offload(self, keys, slots):
        assert self.linker.offload([PoolTransfer(name=PoolName.KV, device_indices=slots,
                                                 keys=list(keys))])
        deadline = time.time() + 30
        while self.linker.num_completed_offloads() < 1:
            assert time.time() < deadline, "offload did not complete"
            time.sleep(0.002)
        return self.linker.pop_completed_offload()

    def lookup(self, rid, keys):
        return self.linker.lookup(rid, [PoolTransfer(name=PoolName.KV, keys=list(keys))])

    def load(self, rid, keys, slots, want=None):
        """Queues, starts and consumes a load the way the forward does; with `want` (rows per
        layer, as rows() gives them) each layer is compared when its wait returns."""
        assert self.linker.load(rid, [PoolTransfer(name=PoolName.KV, device_indices=slots,
                                                   keys=list(keys))])
        index = self.linker.start_layer_wise_loading()
        assert index >= 0
        counter = self.linker.layer_done_counter
        counter.set_consumer(index)
        per_layer = 1 if self.mla else 2
        early = []
        for layer in range(LAYERS):
            self.pool.get_key_buffer(layer)  # waits on the counter, as attention does
            if want is not None:
                for j, b in enumerate(layer_buffers(self.pool, layer)):
                    got = b[slots].view(torch.uint8)
                    if not torch.equal(got, want[layer * per_layer + j]):
                        early.append(layer)
        ok = self.linker.finish_layer_wise_loading(index)
        counter.set_consumer(-1)
        assert not early, f"layers {early} were not complete when their counter fired"
        return ok

    def close(self):
        self.linker.close()


def hashes(n, tag):
    return [f"{tag}{i:060x}" for i in range(n)]


def round_trip(sock, mla):
    rig = Rig(sock, mla)
    try:
        keys = hashes(PAGES, "rt")
        src = rig.slots(PAGES)
        want = rig.rows(src)
        assert rig.lookup("r0", keys) == []
        assert rig.offload(keys, src) is True
        assert rig.lookup("r1", keys + ["absent"]) == list(range(1, PAGES + 1))
        dst = rig.slots(PAGES)
        rig.poison(dst)
        assert rig.load("r1", keys, dst, want) is True
        got = rig.rows(dst)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), "restored bytes differ"
        # Partial hit: two stored pages, then a miss; the load fills exactly two pages.
        mixed = keys[:2] + hashes(3, "miss")
        assert rig.lookup("r2", mixed) == [1, 2]
        dst2 = rig.slots(3)
        rig.poison(dst2)
        want2 = [w.view(PAGES, PAGE, -1)[:2].reshape(2 * PAGE, *w.shape[1:]) for w in want]
        assert rig.load("r2", keys[:2], dst2[: 2 * PAGE], want2) is True
        # Two pages with a local lookup handle: enqueued by start_layer_wise_loading itself, the
        # forward's stream waiting on the device (the per-layer check above ran after each wait).
        assert rig.linker.stats["load_inline"] >= 1, rig.linker.stats
        tail = rig.rows(dst2[2 * PAGE:])
        assert all(bool((t == 0xAB).all()) for t in tail), "a slot past the hit was written"
        # Overlapping offload: stored pages skipped, new ones written, result True.
        more = hashes(PAGES + 2, "rt")
        src2 = torch.cat([src, rig.slots(2)])
        want_more = rig.rows(src2)
        assert rig.offload(more, src2) is True
        assert rig.lookup("r3", more) == list(range(1, PAGES + 3))
        dst3 = rig.slots(PAGES + 2)
        rig.poison(dst3)
        assert rig.load("r3", more, dst3, want_more) is True
        stats = rig.linker.stats
        assert stats["load_failures"] == 0 and stats["offload_failures"] == 0, stats
        return f"{rig.linker.view.value_len} B/page, {stats['load_pages']} pages restored"
    finally:
        rig.close()


def slow_load_layer_readiness(sock):
    """A larger load on one thread block (sm_budget=1): each layer's bytes must be complete the
    moment its counter wait returns."""
    rig = Rig(sock, False, namespace="linker-slow", sm_budget=1)
    try:
        n = 100
        keys = hashes(n, "slow")
        src = rig.slots(n)
        want = rig.rows(src)
        assert rig.offload(keys, src) is True
        assert rig.lookup("s", keys) == list(range(1, n + 1))
        dst = rig.slots(n)
        rig.poison(dst)
        t0 = time.perf_counter()
        assert rig.load("s", keys, dst, want) is True
        dt = time.perf_counter() - t0
        mb = n * rig.linker.view.value_len / 1e6
        return f"{n} pages, {mb:.0f} MB in {dt * 1e3:.1f} ms, each layer complete at its wait"
    finally:
        rig.close()


def mla_rank_one(sock):
    r0 = Rig(sock, True, tp_rank=0, tp_size=2, namespace="linker-mla")
    r1 = Rig(sock, True, tp_rank=1, tp_size=2, namespace="linker-mla")
    try:
        keys = hashes(4, "mla")
        s1 = r1.slots(4)
        assert r1.offload(keys, s1) is True  # reports stored, writes nothing
        assert r0.lookup("x", keys) == [] and r1.lookup("x", keys) == []
        s0 = r0.slots(4)
        want = r0.rows(s0)
        assert r0.offload(keys, s0) is True
        assert r1.lookup("y", keys) == [1, 2, 3, 4]
        d1 = r1.slots(4)
        r1.poison(d1)
        assert r1.load("y", keys, d1, want) is True
        return "rank 1 restored rank 0's pages byte-exact"
    finally:
        r0.close()
        r1.close()


def two_processes(sock, tmp):
    rig = Rig(sock, False, namespace="linker-2p")
    try:
        keys = hashes(PAGES, "2p")
        src = rig.slots(PAGES)
        want = rig.rows(src)
        assert rig.offload(keys, src) is True
        path = os.path.join(tmp, "want.pt")
        torch.save([w.cpu() for w in want], path)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", sock, path,
                              json.dumps(keys)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0 or "CHILD OK" not in out.stdout:
            raise AssertionError(f"child failed: {out.stdout[-800:]} {out.stderr[-1500:]}")
        return out.stdout.strip().splitlines()[-1]
    finally:
        rig.close()


def child(sock, path, keys_json):
    keys = json.loads(keys_json)
    want = [w.cuda() for w in torch.load(path)]
    rig = Rig(sock, False, namespace="linker-2p")
    try:
        assert rig.lookup("c", keys) == list(range(1, len(keys) + 1))
        dst = rig.slots(len(keys))
        rig.poison(dst)
        assert rig.load("c", keys, dst, want) is True
        assert all(torch.equal(a, b) for a, b in zip(rig.rows(dst), want))
        print(f"CHILD OK: pid {os.getpid()} restored {len(keys)} pages offloaded by its parent")
    finally:
        rig.close()


def failures(tmp):
    """Its own daemon: pages deleted under a queued load, then the daemon killed."""
    os.makedirs(os.path.join(tmp, "fail"), exist_ok=True)
    proc, sock = start_daemon(os.path.join(tmp, "fail"))
    rig = None
    try:
        rig = Rig(sock, False, namespace="linker-fail")
        keys = hashes(4, "fail")
        src = rig.slots(4)
        want = rig.rows(src)
        assert rig.offload(keys, src) is True
        fluxon.KvClient(socket_path=sock).delete_prefix("linker-fail:")
        dst = rig.slots(4)
        assert rig.load("gone", keys, dst) is False  # no lookup handle pinned them
        assert rig.offload(keys, src) is True and rig.lookup("back", keys) == [1, 2, 3, 4]
        rig.linker.reset()
        proc.kill()
        proc.wait(timeout=20)
        assert rig.lookup("dead", keys) == []
        assert rig.offload(hashes(2, "late"), rig.slots(2)) is False
        assert rig.load("dead", keys, dst) is False
        assert rig.rows(src)[0].equal(want[0])  # nothing touched the source pages
        return f"stats {rig.linker.stats['load_failures']} load / " \
               f"{rig.linker.stats['offload_failures']} offload failures, no exception"
    finally:
        if rig is not None:
            rig.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)


def swa_refused(sock):
    try:
        Rig(sock, False, components=(ComponentType.FULL, ComponentType.SWA))
    except ValueError as e:
        assert "SWA" in str(e)
        return str(e)[:70]
    raise AssertionError("accepted an SWA component")


def storage_hook(sock):
    from test_sglang_real import HostPool, load  # the storage backend's GPU-test helpers
    from fluxon.sglang import FluxonHiCacheStorage
    assert fluxon.sglang.FluxonLinker is FluxonLinker
    with HostPool(False, "page_first") as pool:
        backend = load(sock, pool, mla=False)
        try:
            assert isinstance(backend, FluxonHiCacheStorage)
            backend.on_host_pools_registered()
        finally:
            backend.close()
    fresh = FluxonHiCacheStorage.__new__(FluxonHiCacheStorage)
    fresh._store = fresh._keys = None
    try:
        fresh.on_host_pools_registered()
    except RuntimeError as e:
        return f"unregistered: {str(e)[:50]}"
    raise AssertionError("hook passed without a host pool")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return 0
    tmp = tempfile.mkdtemp(prefix="fluxon-linker-")
    proc, sock = start_daemon(tmp)
    try:
        check("MHA offload -> lookup -> layer-wise load", lambda: round_trip(sock, False))
        check("MLA offload -> lookup -> layer-wise load", lambda: round_trip(sock, True))
        check("layer readiness, slow 100-page load", lambda: slow_load_layer_readiness(sock))
        check("MLA: rank 0 writes, rank 1 reads", lambda: mla_rank_one(sock))
        check("two processes, one owner", lambda: two_processes(sock, tmp))
        check("deleted pages and a dead owner are failures, not exceptions",
              lambda: failures(tmp))
        check("SWA component refused", lambda: swa_refused(sock))
        check("storage backend on_host_pools_registered", lambda: storage_hook(sock))
    finally:
        stop_daemon(proc, tmp)

    import sglang
    return check.report(f"fluxon.sglang_linker in real SGLang {getattr(sglang, '__version__', '?')}, torch "
                        f"{torch.__version__}")


if __name__ == "__main__":
    sys.exit(main())
