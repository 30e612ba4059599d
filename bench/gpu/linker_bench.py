"""FluxonLinker (SGLang's UnifiedCacheLinker) restore and offload on the GPU, against the same-run
pinned cudaMemcpyAsync ceiling and against SGLang's HiCacheStorage path through fluxon.sglang.

Runs where torch, a GPU and the pinned SGLang are (the GPU machine; `scripts/gpu-run.sh` step
`linkerbench`). Shape: 36 layers x 8 KV heads x head_dim 128, bf16, page 64 tokens, MHA (K and V):
9,437,184 bytes per page.

* Linker: built by SGLang's own `create_unified_cache_linker(..., backend="dynamic")` over a real
  MHATokenToKVPool and SGLang's paged allocator, the layer counter registered on the pool, and
  driven as UnifiedCacheLinkerWrapper drives it:
  - offload: offload() -> num_completed_offloads() polled -> pop_completed_offload(); the time is
    from the offload() call to the completion being visible (fresh keys every round);
  - layer-wise load: lookup() (timed apart), then load() + start_layer_wise_loading() and the
    forward's get_key_buffer(layer) wait for every layer, then finish_layer_wise_loading(); the
    time is from load() to the last layer's wait returning; each layer's ready time is recorded;
  - all-layer load: the same, but only the last layer is waited for.
* Ceiling: one contiguous pinned-host <-> device cudaMemcpyAsync (torch copy_) of the same bytes,
  same direction, timed with CUDA events, in the same rounds.
* HiCacheStorage path: the host pool SGLang builds from the device pool
  (`_build_mha_mla_host_pool`, MHATokenToKVPoolHost, layout page_first) and FluxonHiCacheStorage
  loaded through SGLang's StorageBackendFactory. Offload = device -> host pool
  (backup_from_device_all_layer) then batch_set_v1; restore = batch_get_v1 then
  load_to_device_per_layer for every layer. The device <-> host leg runs SGLang's own method
  with io_backend="kernel" when the host pool has its JIT transfer kernel (can_use_jit);
  otherwise (sgl_kernel is not installed on the GPU machine) it is emulated at the copy engine's
  limit: one contiguous pinned copy of all layers' K (and V) between the host pool's page_first
  rows and a device staging buffer, plus a device gather/scatter per layer. The emulation is a
  lower bound on SGLang's time for that leg, so the comparison favours the HiCache path.
* Every path is checked byte-exact once; medians of --rounds rounds after a warm-up round; the
  order of the paths alternates from round to round.

Usage: FLUXOND=path/to/fluxond python3 bench/gpu/linker_bench.py [--rounds 7] [--pages 1,16,128]
  [--layer-budget-ms 0.5] [--sm-budget N] [--csv out.csv]
--layer-budget-ms is the forward time per layer the restore has to keep up with (default 0.5 ms:
about a 36-layer 8B model's decode step at a typical batch, 18 ms / 36 layers).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker

import fluxon

LAYERS, HEADS, HEAD_DIM, PAGE = 36, 8, 128, 64
NS = "lbench"


def start_daemon(tmp, segment_gib):
    sock = os.path.join(tmp, "owner.sock")
    cfg = os.path.join(tmp, "fluxond.yaml")
    with open(cfg, "w") as f:
        f.write(f"""
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {sock}
  segment: {{size: {segment_gib}GiB}}
""")
    log = open(os.path.join(tmp, "fluxond.log"), "w")
    proc = subprocess.Popen([os.environ.get("FLUXOND", "fluxond"), "--config", cfg], stdout=log,
                            stderr=subprocess.STDOUT)
    for _ in range(600):
        if os.path.exists(sock):
            return proc, sock
        if proc.poll() is not None:
            raise RuntimeError(open(os.path.join(tmp, "fluxond.log")).read())
        time.sleep(0.05)
    raise RuntimeError("fluxond did not start")


def med(xs):
    return statistics.median(xs) if xs else float("nan")


class Bench:
    def __init__(self, sock, max_pages, sm_budget, extra_config=None):
        self.sock = sock
        self.max_pages = max_pages
        size = (2 * max_pages + 4) * PAGE
        self.pool = MHATokenToKVPool(size=size, page_size=PAGE, dtype=torch.bfloat16,
                                     head_num=HEADS, head_dim=HEAD_DIM, layer_num=LAYERS,
                                     device="cuda", enable_memory_saver=False, start_layer=0,
                                     end_layer=LAYERS)
        self.alloc = PagedTokenToKVPoolAllocator(size, PAGE, torch.bfloat16, "cuda",
                                                 kvcache=self.pool, need_sort=False)
        params = CacheInitParams(disable=False, req_to_token_pool=None,
                                 token_to_kv_pool_allocator=self.alloc, page_size=PAGE)
        server_args = SimpleNamespace(model_path="fluxon-bench/llama-8b-shape",
                                      served_model_name=None, tp_size=1,
                                      enable_linker_mla_dedup=False)
        self.forward_stream = torch.cuda.Stream()
        self.params, self.server_args = params, server_args
        self.base_extra = {"socket": sock, "namespace": NS, "tp_rank": 0, "tp_size": 1,
                           **(extra_config or {})}
        if sm_budget:
            self.base_extra["sm_budget"] = sm_budget
        self.linker = self.make_linker()
        self.pool.register_layer_transfer_counter(self.linker.layer_done_counter)
        self.page_bytes = self.linker.view.value_len
        for b in list(self.pool.k_buffer) + list(self.pool.v_buffer):
            b.view(torch.uint8).random_(0, 256)
        self.src = self.alloc.alloc(max_pages * PAGE)
        self.dst = self.alloc.alloc(max_pages * PAGE)
        assert self.src is not None and self.dst is not None
        # Ceiling buffers: pinned host and device, the largest batch's bytes.
        nbytes = max_pages * self.page_bytes
        self.h_pin = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.d_buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.d_buf.random_(0, 256)
        self.h_pin.copy_(self.d_buf.cpu())
        self.host = None
        self.backend = None

    def make_linker(self, **overrides):
        """A FluxonLinker from SGLang's factory (backend "dynamic") on this pool."""
        config = {"linker": "FluxonLinker", "linker_module_path": "fluxon.sglang_linker",
                  "linker_extra_config": {**self.base_extra, **overrides}}
        return create_unified_cache_linker(
            self.server_args, self.params, backend="dynamic", config=config,
            components={ComponentType.FULL}, forward_stream=self.forward_stream)

    # -- Mooncake's MooncakeDirectLinker on the same pool ---------------------------------------

    def setup_mooncake(self, site, segment_gib):
        """SGLang's MooncakeDirectLinker over a local mooncake_master (TCP transport, P2P
        handshake), built by the same factory (backend "mooncake") on the same device pool."""
        if site:
            sys.path.insert(0, site)
        import mooncake
        master = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
        port = 50091
        self.mc_master = subprocess.Popen([master, f"--port={port}"], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
        time.sleep(1.5)
        assert self.mc_master.poll() is None, "mooncake_master exited"
        # No SGLang server publishes its runtime context here: answer the few reads the linker
        # and its pool assembler make (one rank, no unified memory, this model name).
        import sglang.srt.mem_cache.hybrid_cache.linker_pool_assembler as lpa
        import sglang.srt.mem_cache.storage.mooncake_store.mooncake_direct_linker as mdl

        class _Ctx:
            def __getattr__(self, name):
                if name.endswith("_size"):
                    return 1
                if name.endswith("_rank"):
                    return 0
                if name == "model_path":
                    return "fluxon-bench/llama-8b-shape"
                return False

        for mod in (mdl, lpa):
            for fn in ("get_parallel", "get_model", "get_memory"):
                if hasattr(mod, fn):
                    setattr(mod, fn, lambda: _Ctx())

        # SGLang 0.5.23's strategy registry builds a direct-linker pool group only for hybrid
        # models (DeepSeek-V4, Mamba, Mamba+SWA, DSA) and refuses a plain FULL MHA pool. Build the
        # group the way those strategies build their FULL component: SGLang's own
        # _mha_device_pool_entry over the pool's K and V buffers, one layer per layer.
        def plain_full_group(*, kvcache, page_size, params, components):
            entry = lpa._mha_device_pool_entry(PoolName.KV, kvcache,
                                               {i: i for i in range(len(kvcache.k_buffer))},
                                               page_size)
            return lpa.DevicePoolGroup([entry], len(kvcache.k_buffer), page_size)

        mdl.resolve_hybrid_device_pool_group = plain_full_group
        extra = {"master_server_address": f"127.0.0.1:{port}", "protocol": "tcp",
                 "metadata_server": "P2PHANDSHAKE", "global_segment_size": f"{segment_gib}gb",
                 "local_hostname": "127.0.0.1", "device_name": ""}
        params = CacheInitParams(disable=False, req_to_token_pool=None,
                                 token_to_kv_pool_allocator=self.alloc, page_size=PAGE)
        server_args = SimpleNamespace(model_path="fluxon-bench/llama-8b-shape",
                                      served_model_name=None, tp_size=1,
                                      enable_linker_mla_dedup=False)
        self.mc_linker = create_unified_cache_linker(
            server_args, params, backend="mooncake", config=extra,
            components={ComponentType.FULL}, forward_stream=self.forward_stream)

    def close_mooncake(self):
        if getattr(self, "mc_linker", None) is not None:
            try:
                self.mc_linker.close()
            except Exception as e:  # noqa: BLE001
                print(f"mooncake linker close: {e}")
        if getattr(self, "mc_master", None) is not None:
            self.mc_master.terminate()
            self.mc_master.wait(timeout=20)

    # -- helpers ----------------------------------------------------------------------------

    def rows(self, slots):
        return [b[slots].view(torch.uint8) for layer in range(LAYERS)
                for b in (self.pool.k_buffer[layer], self.pool.v_buffer[layer])]

    def same(self, a_slots, b_slots):
        return all(torch.equal(x, y) for x, y in zip(self.rows(a_slots), self.rows(b_slots)))

    def poison(self, slots):
        for b in list(self.pool.k_buffer) + list(self.pool.v_buffer):
            b.view(torch.uint8)[slots] = 0xAB
        torch.cuda.synchronize()

    # -- ceiling ----------------------------------------------------------------------------

    def ceiling(self, n, h2d):
        nb = n * self.page_bytes
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        if h2d:
            self.d_buf[:nb].copy_(self.h_pin[:nb], non_blocking=True)
        else:
            self.h_pin[:nb].copy_(self.d_buf[:nb], non_blocking=True)
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / 1e3

    # -- linker -----------------------------------------------------------------------------

    def linker_offload(self, keys, slots, linker=None):
        linker = linker or self.linker
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        assert linker.offload([PoolTransfer(name=PoolName.KV, device_indices=slots,
                                            keys=list(keys))])
        deadline = t0 + 60
        while linker.num_completed_offloads() < 1:
            if time.perf_counter() > deadline:
                raise RuntimeError("offload did not complete")
            time.sleep(20e-6)
        dt = time.perf_counter() - t0
        assert linker.pop_completed_offload() is True, "offload failed"
        return dt

    def linker_load(self, rid, keys, slots, layer_wise, linker=None):
        """Returns (lookup s, load s, per-layer ready times from load())."""
        linker = linker or self.linker
        # The pool's layer waits follow the counter of the linker that loads.
        self.pool.register_layer_transfer_counter(linker.layer_done_counter)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hits = linker.lookup(rid, [PoolTransfer(name=PoolName.KV, keys=list(keys))])
        t1 = self.last_load_t0 = time.perf_counter()
        # Layer times are taken on the forward's stream (idle until now, so `start` runs at t1):
        # a batch the linker enqueues inline is waited for on the device, and its wait_until
        # returns at once; an event after each wait then marks when that layer was usable.
        if not hasattr(self, "_marks"):  # made once: a new event per layer would time itself
            self._start = torch.cuda.Event(enable_timing=True)
            self._marks = [torch.cuda.Event(enable_timing=True) for _ in range(LAYERS)]
        start = self._start
        start.record()
        hit = max(hits) if hits else 0  # every restorable prefix length: the longest
        assert hit == len(keys), f"lookup hit {hits} of {len(keys)}"
        assert linker.load(rid, [PoolTransfer(name=PoolName.KV, device_indices=slots,
                                              keys=list(keys))])
        index = linker.start_layer_wise_loading()
        assert index >= 0
        counter = linker.layer_done_counter
        counter.set_consumer(index)
        marks = []
        if layer_wise:
            for layer in range(LAYERS):
                self.pool.get_key_buffer(layer)  # the attention layer's wait
                marks.append(self._marks[layer])
                marks[-1].record()
        else:
            self.pool.get_key_buffer(LAYERS - 1)
        torch.cuda.current_stream().synchronize()  # the forward's stream has what it waited for
        t2 = time.perf_counter()
        ready = [start.elapsed_time(e) / 1e3 for e in marks]
        ok = linker.finish_layer_wise_loading(index)
        counter.set_consumer(-1)
        assert ok, "load failed"
        return t1 - t0, t2 - t1, ready

    # -- HiCacheStorage path ------------------------------------------------------------------

    def setup_hicache(self, sock):
        from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import (
            _build_mha_mla_host_pool)
        self.host = _build_mha_mla_host_pool(pool=self.pool, host_to_device_ratio=2.0,
                                             page_size=PAGE, layout="page_first",
                                             allocator_type="default", pool_label="kv")
        wanted = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                      is_mla_model=False, enable_storage_metrics=False,
                      is_page_first_layout=True, model_name="fluxon-bench/llama-8b-shape",
                      extra_config={"backend_name": "fluxon", "module_path": "fluxon.sglang",
                                    "class_name": "FluxonHiCacheStorage", "interface_v1": 1,
                                    "socket": sock, "namespace": NS + "hc"})
        names = {f.name for f in dataclasses.fields(HiCacheStorageConfig)}
        cfg = HiCacheStorageConfig(**{k: v for k, v in wanted.items() if k in names})
        self.backend = StorageBackendFactory.create_backend("dynamic", cfg, self.host)
        self.backend.register_mem_pool_host(self.host)
        n = self.max_pages
        self.h_src = torch.arange(PAGE, (n + 1) * PAGE, dtype=torch.int64)
        self.h_dst = torch.arange((n + 1) * PAGE, (2 * n + 1) * PAGE, dtype=torch.int64)
        self.stream = torch.cuda.Stream()
        self.copy_note = "host pool has no JIT transfer kernel (can_use_jit False)"
        self.use_sglang_copy = bool(getattr(self.host, "can_use_jit", False))
        if self.use_sglang_copy:
            try:  # SGLang's own device <-> host methods, once on one page
                self.d2h(self.h_src[:PAGE], self.src[:PAGE])
                self.h2d(self.h_src[:PAGE], self.dst[:PAGE])
                self.copy_note = "SGLang's JIT transfer kernel (io_backend kernel)"
            except Exception as e:  # noqa: BLE001 - sgl_kernel stub or no JIT build
                self.use_sglang_copy = False
                self.copy_note = f"SGLang's kernel call failed: {type(e).__name__}: {e}"[:160]
        if not self.use_sglang_copy:
            self.stage = [torch.empty((n * PAGE, LAYERS, HEADS, HEAD_DIM), dtype=torch.bfloat16,
                                      device="cuda") for _ in range(2)]
            self.copy_note = "emulated (one pinned copy + device gather/scatter); " + \
                self.copy_note

    def _host_bufs(self):
        return (self.host.k_buffer, self.host.v_buffer)

    def d2h(self, h_idx, d_idx):
        """Device -> host pool, all layers (SGLang's write-back before the storage backup)."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(self.stream):
            if self.use_sglang_copy:
                # As HiCacheController._move_write_operation: the page_first staged write-back
                # takes CPU host indices, every other kernel path CUDA ones.
                hi = h_idx if getattr(self.host, "can_use_write_back_jit", False) else \
                    h_idx.cuda()
                self.host.backup_from_device_all_layer(self.pool, hi, d_idx, "kernel")
            else:
                nt = int(d_idx.numel())
                h0 = int(h_idx[0])
                for st, dev, hb in zip(self.stage, (self.pool.k_buffer, self.pool.v_buffer),
                                       self._host_bufs()):
                    for layer in range(LAYERS):
                        st[:nt, layer].copy_(dev[layer].index_select(0, d_idx))
                    hb[h0:h0 + nt].copy_(st[:nt], non_blocking=True)
        self.stream.synchronize()
        return time.perf_counter() - t0

    def h2d(self, h_idx, d_idx):
        """Host pool -> device, every layer in order (SGLang's per-layer load)."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(self.stream):
            if self.use_sglang_copy:
                hd = h_idx.cuda()
                for layer in range(LAYERS):
                    self.host.load_to_device_per_layer(self.pool, hd, d_idx, layer, "kernel")
            else:
                nt = int(d_idx.numel())
                h0 = int(h_idx[0])
                for st, hb in zip(self.stage, self._host_bufs()):
                    st[:nt].copy_(hb[h0:h0 + nt], non_blocking=True)
                for layer in range(LAYERS):
                    for st, dev in zip(self.stage, (self.pool.k_buffer, self.pool.v_buffer)):
                        dev[layer].index_copy_(0, d_idx, st[:nt, layer])
        self.stream.synchronize()
        return time.perf_counter() - t0

    def hc_offload(self, keys, d_idx):
        n = len(keys)
        h_idx = self.h_src[: n * PAGE]
        a = self.d2h(h_idx, d_idx)
        t0 = time.perf_counter()
        res = self.backend.batch_set_v1(list(keys), h_idx)
        b = time.perf_counter() - t0
        assert all(res), "batch_set_v1 failed"
        return a, b

    def hc_restore(self, keys, d_idx):
        n = len(keys)
        h_idx = self.h_dst[: n * PAGE]
        t0 = time.perf_counter()
        assert self.backend.batch_exists(list(keys)) == n
        res = self.backend.batch_get_v1(list(keys), h_idx)
        a = time.perf_counter() - t0
        assert all(res), "batch_get_v1 failed"
        b = self.h2d(h_idx, d_idx)
        return a, b


def profile(b, sizes, keys, page):
    """Wraps the linker's internal steps with timers (instance attributes shadow the methods) and
    runs 3 more layer-wise loads and offloads per size; returns {pages: {step: [s, ...]}}."""
    lk, ops = b.linker, b.linker._ops
    cur = {}

    def timed(name, fn):
        def w(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                cur[name] = cur.get(name, 0.0) + time.perf_counter() - t
                cur[name + "@end"] = time.perf_counter()
        return w

    marks = {}
    orig_run_load = lk._run_load

    def run_load(*a):
        marks["load_thread_start"] = time.perf_counter()
        return orig_run_load(*a)

    lk._run_load = run_load
    ops.device_pages = timed("device_pages", ops.device_pages)
    if hasattr(ops, "inline_slots"):  # the inline lanes' slot step (their kernels derive pages)
        ops.inline_slots = timed("device_pages", ops.inline_slots)
        ops.write_inline = timed("write_launch", ops.write_inline)
    ops.restore_layers = timed("restore_launches", ops.restore_layers)
    ops.restore_all = timed("restore_launches", ops.restore_all)
    ops.write = timed("write_launch", ops.write)
    lk._open_get = timed("open_get", lk._open_get)
    lk._put_chunk = timed("put_chunk(all)", lk._put_chunk)
    # The inline offload's two owner round trips: the reservation in offload() and the commit
    # once the write's event fired.
    lk._reserve_put = timed("reserve", lk._reserve_put)
    orig_decide = lk._decide_inline

    def decide(rec, block):  # timed only when it decided (a poll before the event is not)
        t = time.perf_counter()
        verdict = orig_decide(rec, block)
        if verdict is not None:
            cur["commit"] = cur.get("commit", 0.0) + time.perf_counter() - t
        return verdict

    lk._decide_inline = decide
    out = {}
    try:
        for r in range(3):
            for n in sizes:
                src, dst = b.src[: n * page], b.dst[: n * page]
                d = out.setdefault(n, {})
                cur.clear()
                marks.clear()
                _, load_s, ready = b.linker_load(f"pf{r}", keys("ld", n), dst, True)
                t_load0 = b.last_load_t0
                for k in ("device_pages", "restore_launches", "open_get"):
                    d.setdefault("load." + k, []).append(cur.get(k, 0.0))
                d.setdefault("load.queue_to_thread", []).append(
                    marks.get("load_thread_start", t_load0) - t_load0)
                d.setdefault("load.launches_done", []).append(
                    cur.get("restore_launches@end", t_load0) - t_load0)
                d.setdefault("load.first_layer_ready", []).append(ready[0])
                d.setdefault("load.total", []).append(load_s)
                cur.clear()
                ks = keys(f"p{r}", n)
                off_s = b.linker_offload(ks, src)
                for k in ("device_pages", "write_launch", "put_chunk(all)", "reserve", "commit"):
                    d.setdefault("offload." + k, []).append(cur.get(k, 0.0))
                d.setdefault("offload.total", []).append(off_s)
                fluxon.KvClient(socket_path=b.sock).delete_prefix(f"{NS}:p{r}")
    finally:
        for name in ("device_pages", "inline_slots", "write_inline", "restore_layers",
                     "restore_all", "write"):
            ops.__dict__.pop(name, None)
        for name in ("_run_load", "_open_get", "_put_chunk", "_reserve_put", "_decide_inline"):
            lk.__dict__.pop(name, None)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", default="1,16,128")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layer-budget-ms", type=float, default=0.5)
    ap.add_argument("--sm-budget", type=int, default=0, help="linker sm_budget (0: its default)")
    ap.add_argument("--segment-gib", type=int, default=8)
    ap.add_argument("--csv", default="")
    ap.add_argument("--no-hicache", action="store_true")
    ap.add_argument("--variants", default="",
                    help="more FluxonLinkers measured in the same rounds: "
                         "'name:key=value,key=value;name2:...' (linker_extra_config overrides)")
    ap.add_argument("--mooncake", action="store_true",
                    help="also SGLang's MooncakeDirectLinker (mooncake-transfer-engine-cuda13)")
    ap.add_argument("--mooncake-site", default="", help="where the mooncake package is installed")
    ap.add_argument("--mooncake-segment-gib", type=int, default=24)
    args = ap.parse_args()
    sizes = [int(x) for x in args.pages.split(",")]
    tmp = tempfile.mkdtemp(prefix="fluxon-lbench-")
    proc, sock = start_daemon(tmp, args.segment_gib)
    t_start = time.time()
    try:
        return run(args, sizes, sock, t_start)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, sizes, sock, t_start):
    b = Bench(sock, max(sizes), args.sm_budget)
    variants = {}
    for spec in filter(None, args.variants.split(";")):
        name, _, kv = spec.partition(":")
        over = {}
        for item in filter(None, kv.split(",")):
            k, _, v = item.partition("=")
            over[k] = int(v) if v.lstrip("-").isdigit() else v
        variants[name] = b.make_linker(**over)
    hc = not args.no_hicache
    if hc:
        b.setup_hicache(sock)
    mc = args.mooncake
    if mc:
        b.setup_mooncake(args.mooncake_site, args.mooncake_segment_gib)
    client = fluxon.KvClient(socket_path=sock)
    pb = b.page_bytes
    R = {}  # (n, metric) -> list of seconds

    def add(n, k, v):
        R.setdefault((n, k), []).append(v)

    def keys(tag, n):
        return [f"{tag}{n:03d}x{i:056x}" for i in range(n)]

    # Pages every round loads (stored once, checked byte-exact once).
    for n in sizes:
        src, dst = b.src[: n * PAGE], b.dst[: n * PAGE]
        b.linker_offload(keys("ld", n), src)
        b.poison(dst)
        b.linker_load("chk", keys("ld", n), dst, True)
        assert b.same(src, dst), f"linker restore of {n} pages differs"
        if hc:
            b.hc_offload(keys("hl", n), src)
            b.poison(dst)
            b.hc_restore(keys("hl", n), dst)
            assert b.same(src, dst), f"HiCache restore of {n} pages differs"
        for vname, vl in variants.items():
            b.poison(dst)
            b.linker_load(f"vchk{vname}", keys("ld", n), dst, True, vl)
            assert b.same(src, dst), f"variant {vname}: restore of {n} pages differs"
        if mc:
            b.linker_offload(keys("ml", n), src, b.mc_linker)
            b.poison(dst)
            b.linker_load("mchk", keys("ml", n), dst, True, b.mc_linker)
            assert b.same(src, dst), f"Mooncake linker restore of {n} pages differs"
    print(f"set-up and checks: {time.time() - t_start:.1f} s; device<->host leg of the HiCache "
          f"path: {b.copy_note if hc else '-'}", flush=True)

    for r in range(args.rounds + 1):  # round 0 is the warm-up
        order = sizes if r % 2 == 0 else sizes[::-1]
        for n in order:
            src, dst = b.src[: n * PAGE], b.dst[: n * PAGE]
            jobs = []
            ok = keys(f"o{r:02d}", n)
            hk = keys(f"h{r:02d}", n)
            jobs.append(("ceil_d2h", lambda: b.ceiling(n, False)))
            jobs.append(("off", lambda: b.linker_offload(ok, src)))
            jobs.append(("ceil_h2d", lambda: b.ceiling(n, True)))
            jobs.append(("lw", lambda: b.linker_load(f"lw{r}", keys("ld", n), dst, True)))
            jobs.append(("al", lambda: b.linker_load(f"al{r}", keys("ld", n), dst, False)))
            if hc:
                jobs.append(("hc_off", lambda: b.hc_offload(hk, src)))
                jobs.append(("hc_res", lambda: b.hc_restore(keys("hl", n), dst)))
            for vname, vl in variants.items():
                vk = keys(f"o{r:02d}{vname}", n)
                jobs.append((f"v_{vname}_off", lambda vk=vk, vl=vl: b.linker_offload(vk, src, vl)))
                jobs.append((f"v_{vname}_lw", lambda vname=vname, vl=vl: b.linker_load(
                    f"vlw{vname}{r}", keys("ld", n), dst, True, vl)))
                jobs.append((f"v_{vname}_al", lambda vname=vname, vl=vl: b.linker_load(
                    f"val{vname}{r}", keys("ld", n), dst, False, vl)))
            if mc:
                mk = keys(f"m{r:02d}", n)
                jobs.append(("mc_off", lambda: b.linker_offload(mk, src, b.mc_linker)))
                jobs.append(("mc_lw", lambda: b.linker_load(f"mlw{r}", keys("ml", n), dst, True,
                                                            b.mc_linker)))
            if r % 2:
                jobs.reverse()
            for name, fn in jobs:
                v = fn()
                if r == 0:
                    continue
                if name == "mc_lw" or (name.startswith("v_") and name[-3:] in ("_lw", "_al")):
                    add(n, name, v[1])
                elif name in ("lw", "al"):
                    lk, ld, ready = v
                    add(n, name, ld)
                    add(n, name + "_lookup", lk)
                    if ready:
                        add(n, "lw_first", ready[0])
                        gaps = [y - x for x, y in zip(ready, ready[1:])]
                        add(n, "lw_gap_med", med(gaps))
                        add(n, "lw_gap_max", max(gaps))
                        budget = args.layer_budget_ms / 1e3
                        fwd = 0.0
                        for t in ready:  # the forward runs a layer once its KV is there
                            fwd = max(fwd, t) + budget
                        add(n, "lw_stall", fwd - LAYERS * budget)
                elif name in ("hc_off", "hc_res"):
                    add(n, name + "_dev", v[0] if name == "hc_off" else v[1])
                    add(n, name + "_store", v[1] if name == "hc_off" else v[0])
                    add(n, name, v[0] + v[1])
                else:
                    add(n, name, v)
            client.delete_prefix(f"{NS}:o{r:02d}")
            if hc:
                client.delete_prefix(f"{NS}hc:h{r:02d}")
        print(f"round {r} done at {time.time() - t_start:.1f} s", flush=True)
    prof = profile(b, sizes, keys, PAGE)
    b.linker.close()
    for vl in variants.values():
        vl.close()
    if mc:
        b.close_mooncake()
    if hc:
        b.backend.close()
        destroy = getattr(b.host, "destroy", None)
        if callable(destroy):
            destroy()

    def gbs(n, k):
        return n * pb / med(R[(n, k)]) / 1e9

    def ms(n, k):
        return med(R[(n, k)]) * 1e3

    print(f"\n## FluxonLinker on {torch.cuda.get_device_name()} (36 layers x 8 KV heads x 128, bf16, "
          f"page 64, MHA: {pb} B/page; medians of {args.rounds} rounds; sm_budget "
          f"{args.sm_budget or 'default'})\n")
    print("| direction | pages | MB | ceiling GB/s | linker GB/s (% ceiling) | linker ms | "
          "HiCache path GB/s | HiCache ms (device leg + store leg) | linker / HiCache |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for n in sizes:
        for d, ck, lk, hk in (("offload D2H", "ceil_d2h", "off", "hc_off"),
                              ("restore H2D, layer-wise", "ceil_h2d", "lw", "hc_res"),
                              ("restore H2D, last layer only", "ceil_h2d", "al", "hc_res")):
            c, g = gbs(n, ck), gbs(n, lk)
            if hc:
                hg = gbs(n, hk)
                hcol = f"{hg:.1f}"
                hms = f"{ms(n, hk):.2f} ({ms(n, hk + '_dev'):.2f} + {ms(n, hk + '_store'):.2f})"
                ratio = f"{g / hg:.2f}x"
            else:
                hcol = hms = ratio = "-"
            print(f"| {d} | {n} | {n * pb / 1e6:.1f} | {c:.1f} | {g:.1f} ({100 * g / c:.1f}%) | "
                  f"{ms(n, lk):.2f} | {hcol} | {hms} | {ratio} |")
            rows.append((d, n, c, g, ms(n, lk)))
    if mc:
        print("\n### Against SGLang's MooncakeDirectLinker (mooncake-transfer-engine-cuda13, local "
              "mooncake_master, TCP transport; same pool, pages and rounds)\n")
        print("| direction | pages | ceiling GB/s | FluxonLinker GB/s | FluxonLinker ms | "
              "Mooncake GB/s | Mooncake ms | Fluxon / Mooncake |")
        print("|---|---|---|---|---|---|---|---|")
        for n in sizes:
            for d, ck, lk, mk in (("offload D2H", "ceil_d2h", "off", "mc_off"),
                                  ("restore H2D, layer-wise", "ceil_h2d", "lw", "mc_lw")):
                print(f"| {d} | {n} | {gbs(n, ck):.1f} | {gbs(n, lk):.1f} | {ms(n, lk):.2f} | "
                      f"{gbs(n, mk):.1f} | {ms(n, mk):.2f} | {ms(n, mk) / ms(n, lk):.2f}x |")
    if variants:
        print("\n### FluxonLinker variants (linker_extra_config overrides; same rounds)\n")
        print("| variant | pages | offload GB/s (% ceiling) | ms | layer-wise restore GB/s "
              "(% ceiling) | ms | last layer only GB/s (% ceiling) | ms |")
        print("|---|---|---|---|---|---|---|---|")
        print_rows = [("default", "off", "lw", "al")] + [
            (v, f"v_{v}_off", f"v_{v}_lw", f"v_{v}_al") for v in variants]
        for vname, ok_, lk_, ak_ in print_rows:
            for n in sizes:
                co, ch = gbs(n, "ceil_d2h"), gbs(n, "ceil_h2d")
                go, gl, ga = gbs(n, ok_), gbs(n, lk_), gbs(n, ak_)
                print(f"| {vname} | {n} | {go:.1f} ({100 * go / co:.1f}%) | {ms(n, ok_):.2f} | "
                      f"{gl:.1f} ({100 * gl / ch:.1f}%) | {ms(n, lk_):.2f} | "
                      f"{ga:.1f} ({100 * ga / ch:.1f}%) | {ms(n, ak_):.2f} |")
    print(f"\nlookup (get_start, not in the load times): " + ", ".join(
        f"{n} pages {ms(n, 'lw_lookup'):.2f} ms" for n in sizes))
    print(f"\n### Layer-wise restore, time per layer (budget {args.layer_budget_ms} ms/layer)\n")
    print("| pages | MB/layer | first layer ready ms | median gap ms/layer | max gap ms | "
          "total ms / 36 | forward stall ms at budget |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        print(f"| {n} | {n * pb / LAYERS / 1e6:.2f} | {ms(n, 'lw_first'):.3f} | "
              f"{ms(n, 'lw_gap_med'):.3f} | {ms(n, 'lw_gap_max'):.3f} | "
              f"{ms(n, 'lw') / LAYERS:.3f} | {ms(n, 'lw_stall'):.2f} |")
    print("\n### Where a load's and an offload's time goes (3 extra rounds, medians, ms; "
          "timers wrapped around the linker's own steps)\n")
    names = sorted({k for v in prof.values() for k in v})
    print("| step | " + " | ".join(f"{n} pages" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for k in names:
        print(f"| {k} | " + " | ".join(f"{med(prof[n].get(k, [])) * 1e3:.3f}" for n in sizes)
              + " |")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("pages,metric,median_s,samples\n")
            for (n, k), v in sorted(R.items()):
                f.write(f"{n},{k},{med(v):.6e},{len(v)}\n")
    print(f"\nlinker stats: {b.linker.stats}")
    print(f"total {time.time() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
