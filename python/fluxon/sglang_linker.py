"""SGLang ``UnifiedCacheLinker`` over Fluxon: device KV pools <-> the owner's shared segment.

Load it through SGLang's dynamic linker path (SGLang 0.5.23)::

    --enable-unified-cache-external-linker --unified-cache-external-linker-backend dynamic
    --unified-cache-external-linker-config '{"linker": "FluxonLinker",
        "linker_module_path": "fluxon.sglang_linker",
        "linker_extra_config": {"socket": "/tmp/fluxon/owner.sock"}}'

There is no host tier: offload writes every layer of a device page into a put plan's value with
Fluxon's write kernel and commits it; load restores into the request's private device slots with
the one-layer restore kernel, layer by layer, on a stream of its own. One Fluxon value per page,
laid out as ``include/fluxon/kv_layout.h`` says (per layer: the page's K rows, then its V rows;
MLA: its KV rows).

* **Pools**: the plain FULL pools SGLang builds for dense models, ``MHATokenToKVPool`` (per-layer
  ``k_buffer``/``v_buffer``) and ``MLATokenToKVPool`` (per-layer ``kv_buffer``). Anything else
  (SWA, Mamba, DSA, DeepSeek-V4, FP4 pools) is refused at construction with the pool's name.
* **Keys**: ``fluxon.hicache.KeyScheme`` (the storage backend's key function) with this layout in
  the fingerprint, so pages written by the linker and by the HiCache backend never meet.
  MLA is rank-replicated: the key has no TP rank, TP rank 0 writes, every rank reads.
* **lookup** opens a get handle (``get_start``) and keeps it for the request's ``load``, which
  consumes it; a handle no load claims is cancelled at the next lookup of the same request, after
  ``lookup_hold_s`` seconds, or by reset/close. No handle is left to the owner's TTL.
* **Layer-wise load**: ``start_layer_wise_loading`` hands the queued loads to the load thread,
  which turns the token slots into page indices on the GPU (after the scheduler stream's
  ``ready`` event; no host round trip), opens the get plans and enqueues the layers a few at a
  time on its own stream, with a CUDA event after each layer: batches of ``staged_min_pages``
  pages or more go through the staged path (copy engines into a staging buffer, then a scatter
  kernel; ~95 % of PCIe), smaller ones through the one-layer restore kernel (lowest latency).
  ``layer_done_counter`` is completed for layer ``l`` once event ``l`` has fired and no kernel
  reported an error. The forward only waits on the counter (no CUDA sync on its thread). Views
  are released after the last layer's copies finished. A small batch (``inline_load_pages``,
  default 4 pages) whose lookup handles are all local skips the thread: start_layer_wise_loading
  opens its plans and enqueues every layer in one restore kernel per load on a stream of its
  own, and the counter makes the forward's stream wait on that batch's CUDA event (no host wait);
  ``finish_layer_wise_loading`` checks the kernels' error word and releases the views.
* **Offload**: the offload thread computes the page indices on its stream after
  ``record_offload_ready()``'s events, reserves a put plan (pages already stored are skipped:
  ``KeyConflictError``), runs the write (staged path from ``staged_min_pages`` pages, else the
  write kernel), waits for it, checks the kernels' error word (a slot row that is not a whole
  page aborts the put), commits (``parent_key``: the page before, when known) and only then
  reports the result.
* **Failures** never raise into SGLang's scheduler thread: an unreachable owner gives no hit and
  failed offloads, the client reconnects on a later call, and a failed load is reported by
  ``finish_layer_wise_loading``. Configuration problems (pool kind, owner not running at start,
  CUDA registration of the segment) raise at construction.

Importing this module needs neither torch nor SGLang (tests exercise the logic with stand-ins);
constructing the linker for real needs both.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass
from queue import Empty, Queue
from typing import Any, Dict, List, Optional, Sequence, Tuple

import fluxon
from fluxon.errors import FluxonError, InvalidArgumentError, KeyConflictError
from fluxon.hicache import KeyScheme, RankIdentity, _dtype_name, _int_attr, _SHAPE_ATTRS

logger = logging.getLogger(__name__)

try:  # the real ABC and counter when SGLang imports (it needs torch)
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
        LayerWiseLoadCounter as _SGLCounter,
        UnifiedCacheLinker as _LinkerBase,
    )
    SGLANG_IMPORT_ERROR: Optional[BaseException] = None
    from sglang.srt.mem_cache.hicache_storage import PoolName as _PoolName
    _KV_POOL: Any = _PoolName.KV
except ImportError as _e:  # torch-free test environments
    _SGLCounter = None
    _KV_POOL = "kv"  # PoolName.KV's value (str(PoolName.KV) == "kv")
    SGLANG_IMPORT_ERROR = _e

    class _LinkerBase:  # type: ignore[no-redef]
        """Stand-in for SGLang's UnifiedCacheLinker where SGLang cannot be imported."""

        forward_stream = None

        def record_offload_ready(self) -> list:
            return []

__all__ = ["FluxonLinker", "LinkerConfig", "SUPPORTED_POOLS", "LINKER_LAYOUT"]

# The device pools served, by exact class name (subclasses add buffers we would not copy).
SUPPORTED_POOLS = {"MHATokenToKVPool": "mha", "MLATokenToKVPool": "mla"}
# The value layout's name in the key fingerprint (never one of the host-pool layouts).
LINKER_LAYOUT = "fluxon_device_layer_major_v1"


class _LocalCounter:
    """LayerWiseLoadCounter's contract, for environments without SGLang (tests)."""

    def __init__(self, num_layers: int, on_layer_ready=None):
        self.num_layers = num_layers
        self.on_layer_ready = on_layer_ready
        self.producer_index = -1
        self.consumer_index = -1
        self.futures: Dict[int, List[Future]] = {}

    def update_producer(self) -> int:
        self.producer_index += 1
        self.futures[self.producer_index] = [Future() for _ in range(self.num_layers)]
        return self.producer_index

    def set_consumer(self, index: int) -> None:
        self.consumer_index = index

    def complete(self, index: int, layer: int) -> None:
        self.futures[index][layer].set_result(None)

    def fail(self, index: int, error: BaseException) -> None:
        for f in self.futures.get(index, ()):
            if not f.done():
                f.set_exception(error)

    def wait_until(self, threshold: int) -> None:
        futures = self.futures.get(self.consumer_index)
        if futures is not None:
            futures[threshold].exception()
            if self.on_layer_ready is not None:
                self.on_layer_ready(self.consumer_index, threshold)

    def finish(self, index: int) -> bool:
        futures = self.futures.get(index)
        if futures is None:
            return True
        landed = all(f.exception() is None for f in futures)
        del self.futures[index]
        return landed

    def reset(self) -> None:
        self.producer_index = -1
        self.consumer_index = -1
        self.futures.clear()


_BaseCounter: Any = _SGLCounter if _SGLCounter is not None else _LocalCounter


class _LayerCounter(_BaseCounter):  # type: ignore[misc, valid-type]
    """The linker's ``layer_done_counter``: SGLang's ``LayerWiseLoadCounter`` (host futures,
    completed by the load thread) for the batches the load thread runs, and device-side waits for
    the small batches ``start_layer_wise_loading`` enqueued whole itself (``set_enqueued``): for
    those, ``wait_until`` makes the forward's current stream wait on the batch's CUDA event and
    returns at once (the copies were all enqueued before the forward began, so the event is
    already recorded), and ``finish`` hands the batch to its finisher (host wait for the copies,
    the kernels' error word, views released) for the verdict."""

    def __init__(self, num_layers: int, on_layer_ready=None):
        super().__init__(num_layers, on_layer_ready)
        self._enqueued: Dict[int, Tuple[Any, Any]] = {}  # index -> (event or None, finisher)

    def set_enqueued(self, index: int, event, finisher) -> None:
        """Batch `index` is on the device: `event` fires after its copies (None: nothing was
        enqueued, it already failed); `finisher()` returns whether it landed."""
        self._enqueued[index] = (event, finisher)

    def wait_until(self, threshold: int) -> None:
        entry = self._enqueued.get(self.consumer_index)
        if entry is None:
            return super().wait_until(threshold)
        if entry[0] is not None:
            entry[0].wait()  # the current (forward) stream waits on the GPU; no host wait
        if self.on_layer_ready is not None:
            self.on_layer_ready(self.consumer_index, threshold)

    def finish(self, index: int) -> bool:
        entry = self._enqueued.pop(index, None)
        if entry is None:
            return super().finish(index)
        self.futures.pop(index, None)
        return entry[1]()

    def has_enqueued(self) -> bool:
        return bool(self._enqueued)

    def take_stale(self, before: int) -> List[Any]:
        """Removes the enqueued batches with an index below `before` (never finished: SGLang
        finishes a batch before starting the third after it); returns their finishers."""
        stale = [i for i in self._enqueued if i < before]
        return [self._enqueued.pop(i)[1] for i in stale]

    def take_enqueued(self) -> List[Any]:
        """Removes every enqueued batch not finished yet; returns their finishers (reset)."""
        entries, self._enqueued = list(self._enqueued.values()), {}
        return [finisher for _, finisher in entries]


def _make_counter(num_layers: int, on_layer_ready=None):
    return _LayerCounter(num_layers, on_layer_ready)


# ----------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class LinkerConfig:
    """``linker_extra_config`` keys of ours (unknown keys are refused: a typo must not pass)."""

    socket: str
    namespace: str = "sglang"
    reconnect_interval_s: float = 1.0
    lookup_hold_s: float = 10.0
    sm_budget: int = 4
    model: Optional[str] = None
    tp_rank: Optional[int] = None
    tp_size: Optional[int] = None
    # Transfers of at least staged_min_pages pages (an offload, or a load batch) go through the
    # staged path: copy engines into a device staging buffer of staging_pages pages x 2 slots per
    # direction (2 x 2 x staging_pages x page bytes of GPU memory), each group's descriptors on
    # copy_streams copy streams (1 measured best), plus a short gather/scatter kernel (copy
    # engines reach ~97 % of PCIe, SM loads ~90 %). Smaller ones use the one-pass kernels (lowest
    # latency). staging_pages 0: always the kernels. layer_path "kernel" or "staged" forces the
    # load path ("auto": by size).
    staging_pages: int = 4
    staged_min_pages: int = 16
    copy_streams: int = 1
    layer_path: str = "auto"
    # lookup's get_start may be answered before pages held by another owner are fetched (they
    # count as hits; the fetch overlaps the scheduler's page allocation, and load waits for it):
    # a lookup never holds the scheduler for a remote read. A page that then cannot be fetched
    # fails that load, as a page evicted since lookup does.
    deferred_lookup: bool = True
    # A load batch of at most inline_load_pages pages whose lookup handles are all local (not
    # deferred) is enqueued by start_layer_wise_loading itself, all layers in one restore kernel
    # per load on a stream of its own, and the forward waits for it on the GPU (one CUDA event):
    # no hand-off to the load thread, no per-layer launches, no host wait. Larger batches keep
    # the layer-by-layer pipeline of the load thread (the forward's first layers overlap the
    # copies of later ones). 0: every batch goes through the load thread.
    inline_load_pages: int = 4
    # An offload of at most inline_offload_pages pages is reserved and its write kernel enqueued
    # by offload() itself (one at a time); num_completed_offloads() commits it once its write
    # finished. No hand-off to the offload thread on either side. 0: every offload goes through
    # the offload thread.
    inline_offload_pages: int = 4

    KEYS = ("socket", "namespace", "reconnect_interval_s", "lookup_hold_s", "sm_budget", "model",
            "tp_rank", "tp_size", "staging_pages", "staged_min_pages", "copy_streams",
            "layer_path", "deferred_lookup", "inline_load_pages", "inline_offload_pages")

    @classmethod
    def from_extra(cls, extra) -> "LinkerConfig":
        extra = {} if extra is None else extra
        if not isinstance(extra, dict):
            raise InvalidArgumentError("linker_extra_config must be a JSON object")
        unknown = sorted(set(extra) - set(cls.KEYS))
        if unknown:
            raise InvalidArgumentError(
                f"FluxonLinker: unknown linker_extra_config keys {unknown} (known: "
                f"{', '.join(cls.KEYS)})")

        def num(name, default, lo, integer=False):
            v = extra.get(name, default)
            ok = isinstance(v, int) if integer else isinstance(v, (int, float))
            if isinstance(v, bool) or not ok or v < lo:
                kind = "an int" if integer else "a number"
                raise InvalidArgumentError(f"linker_extra_config {name!r} must be {kind} >= {lo}, "
                                           f"got {v!r}")
            return v

        sock = extra.get("socket", os.environ.get("FLUXON_SOCKET", fluxon.DEFAULT_SOCKET_PATH))
        ns = extra.get("namespace", cls.namespace)
        for name, v in (("socket", sock), ("namespace", ns)):
            if not isinstance(v, str) or not v:
                raise InvalidArgumentError(f"linker_extra_config {name!r} must be a non-empty "
                                           f"string, got {v!r}")
        if ":" in ns:
            raise InvalidArgumentError(f"namespace {ns!r} must not contain ':'")
        model = extra.get("model")
        if model is not None and (not isinstance(model, str) or not model):
            raise InvalidArgumentError(f"linker_extra_config 'model' must be a non-empty string")
        tp_rank = extra.get("tp_rank")
        tp_size = extra.get("tp_size")
        if (tp_rank is None) != (tp_size is None):
            raise InvalidArgumentError("linker_extra_config tp_rank and tp_size go together")
        if tp_rank is not None:
            num("tp_rank", 0, 0, True)
            num("tp_size", 1, 1, True)
        sm = num("sm_budget", cls.sm_budget, 1, True)
        if sm > 132:
            raise InvalidArgumentError(f"linker_extra_config 'sm_budget' must be <= 132, got {sm}")
        staging = num("staging_pages", cls.staging_pages, 0, True)
        if staging > 64:
            raise InvalidArgumentError(f"linker_extra_config 'staging_pages' must be <= 64, got "
                                       f"{staging}")
        copy_streams = num("copy_streams", cls.copy_streams, 1, True)
        if copy_streams > 8:
            raise InvalidArgumentError(f"linker_extra_config 'copy_streams' must be <= 8, got "
                                       f"{copy_streams}")
        layer_path = extra.get("layer_path", cls.layer_path)
        if layer_path not in ("auto", "kernel", "staged"):
            raise InvalidArgumentError(f"linker_extra_config 'layer_path' must be 'auto', "
                                       f"'kernel' or 'staged', got {layer_path!r}")
        if layer_path == "staged" and staging == 0:
            raise InvalidArgumentError("linker_extra_config 'layer_path' 'staged' needs "
                                       "'staging_pages' > 0")
        inline = {}
        for name in ("inline_load_pages", "inline_offload_pages"):
            inline[name] = num(name, getattr(cls, name), 0, True)
            if inline[name] > 64:
                raise InvalidArgumentError(f"linker_extra_config {name!r} must be <= 64 (larger "
                                           f"transfers are the threads' pipelines), got "
                                           f"{inline[name]}")
        deferred = extra.get("deferred_lookup", cls.deferred_lookup)
        if not isinstance(deferred, bool):
            raise InvalidArgumentError(f"linker_extra_config 'deferred_lookup' must be true or "
                                       f"false, got {deferred!r}")
        return cls(socket=sock, namespace=ns,
                   reconnect_interval_s=float(
                       num("reconnect_interval_s", cls.reconnect_interval_s, 0)),
                   lookup_hold_s=float(num("lookup_hold_s", cls.lookup_hold_s, 0)), sm_budget=sm,
                   model=model,
                   tp_rank=tp_rank, tp_size=tp_size, staging_pages=staging,
                   staged_min_pages=num("staged_min_pages", cls.staged_min_pages, 1, True),
                   copy_streams=copy_streams, layer_path=layer_path, deferred_lookup=deferred,
                   **inline)


# ----------------------------------------------------------------------------------------------
# The device pool


def _component_names(components) -> List[str]:
    names = set()
    for c in components or ():
        names.add(str(getattr(c, "name", c)).upper())
    return sorted(names)


@dataclass(frozen=True)
class PoolView:
    """The device pool as the kernels see it: per-layer buffers of ``[tokens, row]`` rows."""

    pool_name: str
    attention: str  # "mha" | "mla"
    k_buffers: tuple
    v_buffers: tuple
    page_size: int
    row_bytes: int
    tokens: int
    dtype: str
    shape: Tuple[Tuple[str, int], ...]

    @property
    def num_layers(self) -> int:
        return len(self.k_buffers)

    @property
    def device_pages(self) -> int:
        return self.tokens // self.page_size

    @property
    def value_len(self) -> int:
        per_layer = 2 if self.attention == "mha" else 1
        return self.num_layers * per_layer * self.page_size * self.row_bytes

    def geometry_parts(self):
        return (LINKER_LAYOUT, self.dtype, self.page_size, self.shape,
                (self.attention, self.num_layers, self.row_bytes))

    @classmethod
    def of(cls, kvcache, components=None, page_size: Optional[int] = None) -> "PoolView":
        """Validates that `kvcache` is a plain FULL MHA/MLA pool; raises ValueError naming it."""
        name = type(kvcache).__name__
        others = [c for c in _component_names(components) if c != "FULL"]
        if others:
            raise InvalidArgumentError(
                f"FluxonLinker serves only FULL attention pools (MHATokenToKVPool, "
                f"MLATokenToKVPool); this model's cache also has {', '.join(others)} components "
                f"(KV pool {name}). Use the Fluxon HiCache storage backend (fluxon.sglang) for it.")
        attention = SUPPORTED_POOLS.get(name)
        if attention is None:
            kind = ("SWA" if "SWA" in name.upper() else
                    "Mamba/hybrid linear" if "MAMBA" in name.upper() or "LINEAR" in name.upper()
                    else "unsupported")
            raise InvalidArgumentError(
                f"FluxonLinker serves only MHATokenToKVPool and MLATokenToKVPool; the KV pool "
                f"is {name} ({kind} pool). Use the Fluxon HiCache storage backend "
                f"(fluxon.sglang) for it.")
        layout = getattr(kvcache, "kv_cache_layout", None)
        if layout not in (None, "nhd"):
            raise InvalidArgumentError(
                f"FluxonLinker needs token-major ('nhd') KV buffers; {name} uses "
                f"kv_cache_layout={layout!r} (unset SGLANG_USE_HND_KVCACHE)")
        if attention == "mha":
            k, v = list(kvcache.k_buffer), list(kvcache.v_buffer)
            if len(k) != len(v):
                raise InvalidArgumentError(f"{name}: {len(k)} K buffers but {len(v)} V buffers")
        else:
            k, v = list(kvcache.kv_buffer), []
        if not k:
            raise InvalidArgumentError(f"{name} has no layers")
        ps = _int_attr(kvcache, "page_size") or page_size
        if page_size is not None and ps != page_size:
            raise InvalidArgumentError(f"{name}: page_size {ps} but the cache's is {page_size}")
        if not ps or ps <= 0:
            raise InvalidArgumentError(f"{name}: no page size")
        first = k[0]
        tokens = int(first.shape[0])
        row_bytes = (first.numel() // tokens) * first.element_size()
        for b in k + v:
            if int(b.shape[0]) != tokens or (b.numel() // tokens) * b.element_size() != row_bytes:
                raise InvalidArgumentError(f"{name}: KV buffers differ in shape")
            if not b.is_contiguous():
                raise InvalidArgumentError(f"{name}: KV buffers must be contiguous")
        if tokens % ps:
            raise InvalidArgumentError(f"{name}: {tokens} rows is not a multiple of page {ps}")
        if row_bytes * ps % 16:
            raise InvalidArgumentError(f"{name}: a page's rows ({row_bytes * ps} B) are not a "
                                       f"multiple of 16 bytes")
        dtype = _dtype_name(getattr(kvcache, "dtype", None) or getattr(first, "dtype", "?"))
        shape = tuple((a, _int_attr(kvcache, a)) for a in _SHAPE_ATTRS if _int_attr(kvcache, a))
        view = cls(name, attention, tuple(k), tuple(v), ps, row_bytes, tokens, dtype, shape)
        if view.value_len > fluxon.MAX_VALUE_LEN:
            raise InvalidArgumentError(f"{name}: one page is {view.value_len} bytes, over "
                                       f"Fluxon's {fluxon.MAX_VALUE_LEN}-byte value limit")
        return view


def pages_from_token_slots(slots: Sequence[int], page_size: int, device_pages: int) -> List[int]:
    """Page indices of page-aligned token slots (SGLang's paged allocator hands out whole pages);
    raises InvalidArgumentError on slots that are not whole, in-range pages."""
    n = len(slots)
    if n == 0 or n % page_size:
        raise InvalidArgumentError(f"{n} token slots is not a whole number of {page_size}-token "
                                   f"pages")
    pages = []
    for p in range(0, n, page_size):
        first = int(slots[p])
        if first % page_size or first < 0:
            raise InvalidArgumentError(f"token slot {first} does not start a page")
        for j in range(1, page_size):
            if int(slots[p + j]) != first + j:
                raise InvalidArgumentError(f"token slots {first}.. are not one whole page")
        page = first // page_size
        if page >= device_pages:
            raise InvalidArgumentError(f"page {page} is outside the pool ({device_pages} pages)")
        pages.append(page)
    return pages


# ----------------------------------------------------------------------------------------------
# CUDA side (torch + fluxon.kernels), one per linker


_REG_LOCK = threading.Lock()
_REGISTRATIONS: Dict[tuple, list] = {}  # mappings -> [HostRegistration, users]


def _acquire_registration(mappings: tuple):
    """cudaHostRegister of `mappings`, once per process (shared by every linker); raises."""
    from fluxon import kernels as fk
    with _REG_LOCK:
        entry = _REGISTRATIONS.get(mappings)
        if entry is None:
            try:
                reg = fk.register_host_mappings(list(mappings))
            except Exception as e:
                raise RuntimeError(f"FluxonLinker: CUDA registration of the Fluxon mappings "
                                   f"{[m[0] for m in mappings]} failed: {e}") from e
            entry = _REGISTRATIONS[mappings] = [reg, 0]
        entry[1] += 1
        return entry[0]


def _release_registration(mappings: tuple) -> None:
    with _REG_LOCK:
        entry = _REGISTRATIONS.get(mappings)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _REGISTRATIONS[mappings]
            entry[0].close()


class CudaOps:
    """Streams, events and kernel launches of one linker (everything that needs torch).

    Loads and offloads run on two streams of ours, so a load never queues behind an offload.
    Nothing here waits on the host for the scheduler's stream: token slots become page indices on
    the device (a slot row that is not one whole, aligned page becomes page -1, which the kernels
    refuse and report through the plane's error word), so a load's copies are enqueued as soon as
    its plan is open. The inline lanes' kernels read the slots themselves (same rule, no index
    step)."""

    def __init__(self, view: PoolView, config: "LinkerConfig"):
        import torch
        from fluxon import kernels as fk
        self.torch = torch
        self.fk = fk
        self.view = view
        self.config = config
        self.device = view.k_buffers[0].device
        # A stream and a page-index buffer per lane, (offload, inline): the load thread's, the
        # offload thread's, and those of the small transfers the scheduler's thread enqueues
        # itself. A lane's transfers follow each other on its stream, so the next one's indices
        # never overwrite a buffer a kernel still reads; lanes never share one.
        # The inline load lane has no buffer: its kernel reads the token slots (inline_slots).
        self._lanes = {lane: (torch.cuda.Stream(device=self.device),
                              None if lane == (False, True) else
                              torch.empty(view.device_pages, dtype=torch.int64,
                                          device=self.device))
                       for lane in ((False, False), (True, False), (False, True), (True, True))}
        self.load_stream = self._lanes[(False, False)][0]
        self.offload_stream = self._lanes[(True, False)][0]
        self.inline_stream = self._lanes[(False, True)][0]
        self.inline_offload_stream = self._lanes[(True, True)][0]
        self.events = fk.LayerEvents(view.num_layers)  # one load batch at a time (load thread)
        self.layout = fk.KvLayout(view.attention, view.num_layers, view.page_size, view.row_bytes)
        self._k = [int(b.data_ptr()) for b in view.k_buffers]
        self._v = [int(b.data_ptr()) for b in view.v_buffers]

    def bind_thread(self) -> None:
        """CUDA's current device is per thread: the linker's threads use the pool's."""
        self.torch.cuda.set_device(self.device)

    def plane(self, registration, staged: bool = True):
        """A data plane (its own sticky error word, staging buffer and copy streams) checking
        values against `registration`; without `staged`, no staging buffer (kernels only)."""
        return self.fk.DataPlane(self.layout, self._k, self._v, self.view.device_pages, None,
                                 registration,
                                 staging_group_pages=self.config.staging_pages if staged else 0)

    def record_ready(self):
        ev = self.torch.cuda.Event()
        ev.record()  # the scheduler's current stream: the slots and indices are ready there
        return ev

    def offload_ready(self, linker) -> list:
        return linker.record_offload_ready()

    def device_pages(self, slots, wait_events, offload: bool, offset: int = 0,
                     inline: bool = False):
        """Page indices of `slots` (whole, aligned pages), computed on our stream after it waited
        (on the GPU) for `wait_events`; -1 for a slot row that is not a whole page. The result is
        a view of the lane's index buffer at `offset` pages (a load batch gives each load its own
        range), valid until the lane's next transfer. `inline`: a transfer the scheduler's thread
        enqueues itself (its own lane)."""
        torch = self.torch
        ps, n = self.view.page_size, int(slots.numel())
        if n == 0 or n % ps:
            raise InvalidArgumentError(f"{n} token slots is not a whole number of {ps}-token "
                                       f"pages")
        stream, buf = self._lanes[(bool(offload), bool(inline))]
        slots, converted = self._slots_on(stream, slots, wait_events)
        if not converted:
            slots.record_stream(stream)  # the caller's tensor, read on our stream
        if offset + n // ps <= buf.numel():
            pages = buf[offset:offset + n // ps]
        else:  # more pages than the pool holds: only a batch repeating slots gets here
            with torch.cuda.stream(stream):
                pages = torch.empty(n // ps, dtype=torch.int64, device=self.device)
        self.fk.pages_from_slots(int(slots.data_ptr()), slots.element_size(), n, ps,
                                 int(pages.data_ptr()), int(stream.cuda_stream))
        return pages

    def inline_slots(self, slots, wait_events, offload: bool = False):
        """`slots` as an inline lane's kernel reads them, after that lane waited (on the GPU) for
        `wait_events`: the kernel turns each page's slot row into its page index itself (no index
        buffer, no separate kernel). The caller keeps the result until the lane's transfer
        finished."""
        stream = self.inline_offload_stream if offload else self.inline_stream
        return self._slots_on(stream, slots, wait_events)[0]

    def _slots_on(self, stream, slots, wait_events):
        """Makes `stream` wait for `wait_events`; returns (slots as a contiguous int64 or int32
        device tensor, whether that is a copy made on `stream`)."""
        torch = self.torch
        for ev in wait_events:
            stream.wait_event(ev)
        if slots.is_cuda and slots.dtype in (torch.int64, torch.int32) and slots.is_contiguous():
            return slots, False
        with torch.cuda.stream(stream):
            return slots.to(self.device, torch.int64).contiguous(), True

    def select(self, pages_dev, idx: List[int], inline: bool = False):
        torch = self.torch
        with torch.cuda.stream(self.inline_offload_stream if inline else self.offload_stream):
            return pages_dev[torch.tensor(idx, dtype=torch.int64, device=self.device)]

    def _staged(self, pages: int) -> bool:
        """Whether a transfer of `pages` pages takes the staged copy-engine path (both ways)."""
        cfg = self.config
        return bool(cfg.staging_pages) and pages >= cfg.staged_min_pages

    def layer_path(self, pages: int) -> str:
        cfg = self.config
        if cfg.layer_path != "auto":
            return cfg.layer_path
        return "staged" if self._staged(pages) else "kernel"

    def restore_layers(self, plane, work, begin: int, count: int, path: str,
                       continues: bool) -> None:
        """Enqueues layers [begin, begin + count) of every (plan, pages_dev, n) in `work`, event
        `layer` recorded after each layer."""
        plane.restore_layers([(plan, int(pages.data_ptr()), n) for plan, pages, n in work],
                             begin, self.events, begin, count,
                             int(self.load_stream.cuda_stream), path=path,
                             sm_budget=self.config.sm_budget,
                             copy_streams=self.config.copy_streams, continues=continues)

    def restore_all(self, plane, work):
        """Enqueues every layer of every (plan, slots, n) in `work` (slots from inline_slots) on
        the inline stream, one restore kernel per load; returns the CUDA event recorded after
        them."""
        stream = int(self.inline_stream.cuda_stream)
        for plan, slots, n in work:
            plane.restore_pages(plan, 0, n, stream, sm_budget=self.config.sm_budget,
                                **self._slot_args(slots, n))
        ev = self.torch.cuda.Event()
        ev.record(self.inline_stream)
        return ev

    def write_inline(self, plane, plan: int, pages_dev, n: int, by_slots: bool = False):
        """Enqueues the write kernel of a small offload on the inline offload lane (`pages_dev`:
        page indices, or with `by_slots` the token slots from inline_slots); returns the CUDA
        event recorded after it."""
        stream = self.inline_offload_stream
        if by_slots:
            plane.write_pages(plan, 0, n, int(stream.cuda_stream), sm_budget=self.config.sm_budget,
                              **self._slot_args(pages_dev, n))
        else:
            plane.write_pages(plan, int(pages_dev.data_ptr()), n, int(stream.cuda_stream),
                              sm_budget=self.config.sm_budget)
        ev = self.torch.cuda.Event()
        ev.record(stream)
        return ev

    def _slot_args(self, slots, n: int) -> dict:
        """The kernel arguments of `n` pages given by their token slots; the kernel reads
        n * page_size slots, so a tensor of another length is refused here."""
        ps = self.view.page_size
        if int(slots.numel()) != n * ps:
            raise InvalidArgumentError(f"{slots.numel()} token slots for {n} pages of {ps}")
        return dict(token_slots_ptr=int(slots.data_ptr()), token_slot_bytes=slots.element_size(),
                    page_size=ps)

    def drain_inline(self, offload: bool = False) -> None:
        (self.inline_offload_stream if offload else self.inline_stream).synchronize()

    def layer_done(self, layer: int) -> bool:
        return self.events.query(layer)

    def wait_layer(self, layer: int) -> None:
        self.events.synchronize(layer)

    def write(self, plane, plan: int, pages_dev, n: int) -> None:
        cfg = self.config
        stream = int(self.offload_stream.cuda_stream)
        if self._staged(n):
            plane.copy_staged("write", plan, int(pages_dev.data_ptr()), None, stream,
                              sm_budget=cfg.sm_budget, copy_streams=cfg.copy_streams,
                              num_pages=n)
            return
        plane.write_pages(plan, int(pages_dev.data_ptr()), n, stream, sm_budget=cfg.sm_budget)

    def finish_offload(self) -> None:
        self.offload_stream.synchronize()

    def drain(self, offload: bool) -> None:
        (self.offload_stream if offload else self.load_stream).synchronize()

    def mappings(self, client) -> Tuple[tuple, tuple]:
        segs = tuple((s["segment_label"], int(s["write_ptr"]), int(s["len"]))
                     for s in client.wait_local_segments_ready())
        base, size = client.plan_arena()
        return segs, (("plan_arena", int(base), int(size)),)


# ----------------------------------------------------------------------------------------------
# The linker


@dataclass
class _Held:
    """A lookup's get handle, waiting for the request's load."""

    conn: "_Conn"
    handle: Any
    keys: List[str]
    since: float

    def serves(self, conn: "_Conn", keys: List[str]) -> bool:
        """Whether this handle, still open on `conn`, covers `keys` (a prefix of its own)."""
        return self.handle is not None and self.conn is conn and self.keys[:len(keys)] == keys


@dataclass
class _Load:
    rid: str
    keys: List[str]
    slots: Any  # device token slots (tensor)
    held: Optional[_Held]


class _Conn:
    """One KvClient with its CUDA registrations and data planes (none without CudaOps)."""

    def __init__(self, client, ops):
        self.client = client
        self.ops = ops
        self.maps: List[tuple] = []
        # One plane per user, so a kernel's error is taken by the transfer that caused it: the
        # load thread, the offload thread, and the loads start_layer_wise_loading enqueues.
        self.load_plane = self.offload_plane = self.inline_plane = None
        self.inline_offload_plane = None
        if ops is not None:
            segs, arena = ops.mappings(client)
            seg_reg = _acquire_registration(segs)
            self.maps.append(segs)
            try:
                _acquire_registration(arena)
                self.maps.append(arena)
                self.load_plane = ops.plane(seg_reg)
                self.offload_plane = ops.plane(seg_reg)
                self.inline_plane = ops.plane(seg_reg, staged=False)
                self.inline_offload_plane = ops.plane(seg_reg, staged=False)
            except BaseException:
                self.release()
                raise

    def release(self) -> None:
        self.load_plane = self.offload_plane = self.inline_plane = None
        self.inline_offload_plane = None
        maps, self.maps = self.maps, []
        for m in maps:
            _release_registration(m)


@dataclass
class _InlineOffload:
    """A small offload the scheduler's thread enqueued itself: its put plan is reserved and its
    write kernel enqueued; committed (or aborted) once `event` fired."""

    conn: "_Conn"
    plane: Any
    plan: int
    pages: int
    event: Any
    # What the write kernel reads (slots or page indices): kept until the write is decided, so
    # its memory is not reused while the kernel may still read it.
    source: Any = None


class _OffloadResults:
    """Offload verdicts in the order the offloads were asked for (SGLang pairs them with its
    pending offloads by position). The offload thread decides its records; an inline record is
    decided by whoever polls (`decide`, the scheduler's thread) once its write has finished."""

    @dataclass
    class Record:
        verdict: Optional[bool] = None  # None: not decided yet
        inline: Optional[_InlineOffload] = None  # decided by polling; else by the thread

        def undecided_inline(self) -> bool:
            return self.verdict is None and self.inline is not None

    def __init__(self):
        self._lock = threading.Lock()
        self._records: "deque[_OffloadResults.Record]" = deque()

    def add(self, verdict: Optional[bool] = None,
            inline: Optional[_InlineOffload] = None) -> "_OffloadResults.Record":
        rec = self.Record(verdict, inline)
        with self._lock:
            self._records.append(rec)
        return rec

    def set(self, rec: "_OffloadResults.Record", verdict: bool) -> None:
        with self._lock:
            rec.verdict = verdict

    def inline_in_flight(self) -> bool:
        with self._lock:
            return any(r.undecided_inline() for r in self._records)

    def completed(self, decide) -> int:
        """How many verdicts from the front are known; every inline record is decided on the way
        by `decide(inline, block=False)` (None: its write has not finished)."""
        with self._lock:
            records = list(self._records)
        n, prefix = 0, True
        for rec in records:
            if rec.undecided_inline():
                verdict = decide(rec.inline, False)
                if verdict is not None:
                    self.set(rec, verdict)
            if rec.verdict is None:
                prefix = False
            elif prefix:
                n += 1
        return n

    def pop(self) -> bool:
        with self._lock:
            if not self._records or self._records[0].verdict is None:
                raise Empty
            return self._records.popleft().verdict

    def clear(self, decide) -> None:
        """Decides every inline record (waiting for its write), then drops every record."""
        with self._lock:
            records, self._records = list(self._records), deque()
        for rec in records:
            if rec.undecided_inline():
                decide(rec.inline, True)


_MAX_PARENTS = 1 << 16
_MAX_PUT_ROUNDS = 4
_LAUNCH_LAYERS = 4  # layers enqueued per restore call of a layer-wise load


class FluxonLinker(_LinkerBase):
    """SGLang ``UnifiedCacheLinker`` over a Fluxon owner (see the module docstring).

    Constructed by SGLang's factory as ``FluxonLinker(server_args, params, components=...,
    extra_config=..., forward_stream=...)``. ``_ops`` and ``_client_factory`` replace the CUDA
    side and the KvClient (tests).
    """

    def __init__(self, server_args, params, *, components=None, extra_config=None,
                 forward_stream=None, _ops=None, _client_factory=None):
        self.forward_stream = forward_stream
        self.config = LinkerConfig.from_extra(extra_config)
        self.page_size = int(getattr(params, "page_size", 0) or 0) or None
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        self.view = PoolView.of(kvcache, components, self.page_size)
        self.page_size = self.view.page_size
        self.num_layers = self.view.num_layers
        self.pools = {_KV_POOL: kvcache}
        self.ident = self._identity(server_args, params)
        self.keys = KeyScheme.build(self.config.namespace, self.ident, "page",
                                    self.view.geometry_parts())
        self.is_writer = self.ident.is_writer
        self._ops = _ops if _ops is not None else CudaOps(self.view, self.config)
        self._client_factory = _client_factory or (lambda s: fluxon.KvClient(socket_path=s))
        self._lock = threading.RLock()
        self._conn: Optional[_Conn] = None
        self._retired: List[_Conn] = []
        self._last_connect = 0.0
        self.stats = {"lookup": 0, "lookup_hit_pages": 0, "load": 0, "load_inline": 0,
                      "load_pages": 0, "offload_inline": 0,
                      "load_failures": 0, "offload": 0, "offload_pages": 0,
                      "offload_failures": 0, "errors": 0, "reconnects": 0}
        try:
            self._conn = self._new_conn()
        except FluxonError as e:
            raise type(e)(f"FluxonLinker: cannot reach the Fluxon owner at "
                          f"{self.config.socket!r} (is fluxond running? set linker_extra_config "
                          f"'socket'): {e}") from e
        self._last_connect = time.monotonic()

        self.mla_broadcaster = None
        self.broadcast_loads: dict = {}
        self._tp_group = None
        if getattr(server_args, "enable_linker_mla_dedup", False) and \
                self.view.attention == "mla" and self.ident.tp_size > 1:
            self._setup_mla_dedup(kvcache, params)
        self.layer_done_counter = _make_counter(
            self.num_layers, self._broadcast_loaded_layers if self.mla_broadcaster else None)
        self._held: "OrderedDict[str, _Held]" = OrderedDict()
        self._pending: Dict[str, _Load] = {}
        self._parents: "OrderedDict[str, str]" = OrderedDict()
        self._load_q: Queue = Queue()
        self._offload_q: Queue = Queue()
        self._offload_results = _OffloadResults()
        self._closed = False
        self._load_thread = threading.Thread(target=self._load_loop, daemon=True,
                                             name=f"fluxon-linker-load-t{self.ident.tp_rank}")
        self._offload_thread = threading.Thread(
            target=self._offload_loop, daemon=True,
            name=f"fluxon-linker-offload-t{self.ident.tp_rank}")
        self._load_thread.start()
        self._offload_thread.start()
        logger.info("fluxon: linker on %s: %s %s, %d layers, page %d, %d B/page, keys "
                    "%s:<hash>_%s_%s, writer=%s", self.config.socket, self.view.pool_name,
                    self.view.dtype, self.num_layers, self.page_size, self.view.value_len,
                    self.config.namespace, self.keys.fingerprint, self.keys.rank_tag,
                    self.is_writer)

    # -- identity ---------------------------------------------------------------------------

    def _identity(self, server_args, params) -> RankIdentity:
        cfg = self.config
        if cfg.tp_rank is not None:
            tp_rank, tp_size = cfg.tp_rank, cfg.tp_size
        else:
            tp_rank, tp_size = 0, int(getattr(server_args, "tp_size", 1) or 1)
            group = getattr(params, "attn_tp_cache_group", None) or \
                getattr(params, "tp_cache_group", None)
            try:
                import torch.distributed as dist
                if dist.is_available() and dist.is_initialized():
                    tp_rank = dist.get_rank(group=group)
                    tp_size = dist.get_world_size(group=group)
            except ImportError:
                pass
        model = cfg.model or getattr(server_args, "served_model_name", None) or \
            getattr(server_args, "model_path", None) or ""
        return RankIdentity(
            model=str(model).replace("/", "-"), tp_rank=tp_rank, tp_size=tp_size,
            pp_rank=int(getattr(params, "pp_rank", 0) or 0),
            pp_size=int(getattr(params, "pp_size", 1) or 1),
            cp_rank=int(getattr(params, "attn_cp_rank", 0) or 0),
            cp_size=int(getattr(params, "attn_cp_size", 1) or 1),
            is_mla=self.view.attention == "mla")

    def storage_key(self, page_hash: str) -> str:
        """The Fluxon key of an SGLang page hash (for tools and tests)."""
        return self.keys.key(page_hash)

    # -- connection -------------------------------------------------------------------------

    def _new_conn(self) -> _Conn:
        client = self._client_factory(self.config.socket)
        return _Conn(client, self._ops if isinstance(self._ops, CudaOps) else None)

    def _get_conn(self) -> Optional[_Conn]:
        with self._lock:
            if self._conn is not None:
                return self._conn
            now = time.monotonic()
            if now - self._last_connect < self.config.reconnect_interval_s:
                return None
            self._last_connect = now
            try:
                self._conn = self._new_conn()
                self.stats["reconnects"] += 1
                logger.info("fluxon: linker reconnected to %s", self.config.socket)
            except FluxonError as e:
                logger.warning("fluxon: owner at %s still unreachable: %s", self.config.socket, e)
            return self._conn

    def _failed(self, conn: Optional[_Conn], what: str, e: BaseException) -> None:
        logger.warning("fluxon: linker %s failed (%s): %s", what, type(e).__name__, e)
        with self._lock:
            self.stats["errors"] += 1
            if conn is not None and self._conn is conn and isinstance(e, FluxonError) and \
                    not isinstance(e, (InvalidArgumentError, fluxon.NoSpaceError,
                                       fluxon.NotFoundError)):
                self._conn = None  # reconnect on a later call
                self._retired.append(conn)  # in-flight work may still use it; released at close

    # -- keys -------------------------------------------------------------------------------

    def _kv(self, transfers):
        kv = None
        for t in transfers or ():
            name = str(getattr(t, "name", ""))
            if name == str(_KV_POOL):
                kv = t
            else:
                raise InvalidArgumentError(f"FluxonLinker has no pool {name!r}")
        if kv is None:
            raise InvalidArgumentError("no KV transfer")
        return kv

    def _learn_parents(self, stored: List[str]) -> None:
        with self._lock:
            for a, b in zip(stored, stored[1:]):
                self._parents[b] = a
                self._parents.move_to_end(b)
            while len(self._parents) > _MAX_PARENTS:
                self._parents.popitem(last=False)

    # -- lookup -----------------------------------------------------------------------------

    def _cancel_held(self, held: Optional[_Held]) -> None:
        if held is None or held.handle is None:
            return
        h, held.handle = held.handle, None
        try:
            held.conn.client.cancel_get_transfer(h)
        except FluxonError as e:
            logger.debug("fluxon: cancel of a lookup handle failed: %s", e)

    def _sweep_held(self) -> None:
        """Cancels lookup handles no load claimed within lookup_hold_s."""
        cutoff = time.monotonic() - self.config.lookup_hold_s
        stale = []
        with self._lock:
            while self._held:
                rid, held = next(iter(self._held.items()))
                if held.since > cutoff:
                    break
                self._held.popitem(last=False)
                stale.append(held)
        for held in stale:
            self._cancel_held(held)

    def lookup(self, rid: str, transfers) -> List[int]:
        conn = None
        try:
            keys = list(self._kv(transfers).keys or [])[: fluxon.MAX_BATCH_KEYS]
            with self._lock:
                old = self._held.pop(rid, None)
            self._cancel_held(old)
            self._sweep_held()
            if not keys:
                return []
            conn = self._get_conn()
            if conn is None:
                return []
            stored = [self.keys.key(k) for k in keys]
            self._learn_parents(stored)
            h = conn.client.get_start(stored, allow_deferred=self.config.deferred_lookup)
            n = h.result.transferable_len
            self.stats["lookup"] += 1
            if n == 0:
                conn.client.cancel_get_transfer(h)
                return []
            with self._lock:
                self._held[rid] = _Held(conn, h, stored[:n], time.monotonic())
            self.stats["lookup_hit_pages"] += n
            return list(range(1, n + 1))
        except FluxonError as e:
            self._failed(conn, "lookup", e)
            return []
        except Exception:  # never into the scheduler
            logger.exception("fluxon: linker lookup failed")
            return []

    # -- load -------------------------------------------------------------------------------

    def load(self, rid: str, transfers) -> bool:
        try:
            kv = self._kv(transfers)
            keys = list(kv.keys or [])
            slots = kv.device_indices
            if not keys or slots is None or len(keys) > fluxon.MAX_BATCH_KEYS:
                return False
            if int(slots.numel()) != len(keys) * self.page_size:
                logger.error("fluxon: load of %d pages into %d slots", len(keys), slots.numel())
                return False
        except Exception:
            logger.exception("fluxon: linker load refused")
            return False
        stored = [self.keys.key(k) for k in keys]
        with self._lock:
            if rid in self._pending:
                logger.error("fluxon: a load for rid=%s is already queued", rid)
                return False
            held = self._held.pop(rid, None)
            self._pending[rid] = _Load(rid, stored, slots, held)
        return True

    def cancel_queued_load(self, rid: str) -> bool:
        with self._lock:
            ld = self._pending.pop(rid, None)
        if ld is None:
            return False
        self._cancel_held(ld.held)
        return True

    def start_layer_wise_loading(self) -> int:
        broadcaster = self.mla_broadcaster
        if broadcaster is not None:
            broadcaster = self._agree_on_broadcast()
        with self._lock:
            if not self._pending:
                return -1
            pending, self._pending = list(self._pending.values()), {}
        index = self.layer_done_counter.update_producer()
        ready = self._ops.record_ready()
        if broadcaster is not None:
            self._prepare_broadcast(index, pending, ready, broadcaster)
            if not broadcaster.is_src:
                for layer in range(self.num_layers):
                    self.layer_done_counter.complete(index, layer)
                for ld in pending:
                    self._cancel_held(ld.held)
                return index
        self.stats["load"] += len(pending)
        for finish in self.layer_done_counter.take_stale(index - 2):
            logger.warning("fluxon: a small load batch was never finished; its views go back")
            finish()
        # An MLA dedup source broadcasts each layer once the host knows it landed: thread only.
        conn = self._inline_conn(pending) if broadcaster is None else None
        if conn is not None:
            self.stats["load_inline"] += len(pending)
            self._enqueue_inline(index, pending, ready, conn)
        else:
            self._load_q.put((index, pending, ready))
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        if counter_index is None or counter_index < 0:
            return True
        return self.layer_done_counter.finish(counter_index)

    def _open_get(self, conn: _Conn, ld: _Load) -> int:
        """A get plan over exactly ld.keys (the lookup's handle when it covers them)."""
        held, ld.held = ld.held, None
        n = len(ld.keys)
        if held is not None and held.serves(conn, ld.keys):
            h, held.handle = held.handle, None
            return conn.client.get_transfer(h, consume_prefix_len=n) \
                if n < h.result.transferable_len else conn.client.get_transfer(h)
        self._cancel_held(held)
        h = conn.client.get_start(ld.keys, transfer=True)
        if h.result.transferable_len < n:
            conn.client.cancel_get_transfer(h)
            raise fluxon.NotFoundError(f"{n - h.result.transferable_len} of {n} pages are no "
                                       f"longer stored")
        return conn.client.get_transfer(h)

    def _inline_conn(self, loads: List[_Load]) -> Optional[_Conn]:
        """The connection on which start_layer_wise_loading enqueues `loads` itself, or None when
        they go to the load thread. Inline only when small (inline_load_pages) and every load
        holds its lookup's handle over its keys on the current connection, none of them
        deferred: the get_transfer then only turns pins into views, so the scheduler's thread
        never waits for a remote read."""
        limit = self.config.inline_load_pages
        if limit == 0 or not hasattr(self._ops, "restore_all") or \
                sum(len(ld.keys) for ld in loads) > limit:
            return None
        if self.layer_done_counter.has_enqueued():
            return None  # one unfinished inline batch at a time: the error word names its copies
        with self._lock:
            conn = self._conn
        if conn is None:
            return None
        for ld in loads:
            held = ld.held
            if held is None or not held.serves(conn, ld.keys) or \
                    getattr(held.handle.result, "deferred", False):
                return None
        return conn

    def _enqueue_inline(self, index: int, loads: List[_Load], ready, conn: _Conn) -> None:
        """Opens the get plans of `loads` and enqueues all their layers (one restore kernel per
        load) on the inline stream; the counter's batch `index` then waits on the GPU. A failure
        here enqueues nothing more: the batch's layers count as done (the forward runs on
        whatever the slots hold) and finish reports it, as for the load thread's batches."""
        ops = self._ops
        plane = conn.inline_plane
        plans: List[Tuple[_Conn, int]] = []
        # The slot tensors the kernels read: kept until finish (the event then fired), so their
        # memory is not reused while a copy may still read it.
        work: list = []
        event, error = None, None
        try:
            for ld in loads:
                slots = ops.inline_slots(ld.slots, [ready])
                plan = self._open_get(conn, ld)
                plans.append((conn, plan))
                work.append((plan, slots, len(ld.keys)))
            event = ops.restore_all(plane, work)
        except BaseException as e:  # noqa: BLE001 - reported by finish
            error = e
            try:
                ops.drain_inline()  # nothing may still read a plan we release
            except BaseException:  # noqa: BLE001
                logger.exception("fluxon: linker inline load stream failed")
        for ld in loads:
            self._cancel_held(ld.held)
        pages = sum(len(ld.keys) for ld in loads)

        def finish() -> bool:
            err = error
            try:
                if event is not None:
                    event.synchronize()  # after the forward: the copies have long finished
                    if plane is not None:
                        plane.take_device_errors()
            except BaseException as e:  # noqa: BLE001
                err = err or e
            work.clear()
            self._release_plans(plans)
            return self._load_verdict(conn, err, pages)

        self.layer_done_counter.set_enqueued(index, event, finish)

    def _release_plans(self, plans: List[Tuple[_Conn, int]]) -> None:
        for c, plan in plans:
            try:
                c.client.release_views(plan)
            except FluxonError as e:
                logger.warning("fluxon: release_views failed: %s", e)

    def _load_verdict(self, conn: Optional[_Conn], error: Optional[BaseException],
                      pages: int) -> bool:
        """Counts a load batch that ended with `error` (None: landed); True when it landed."""
        if error is None:
            self.stats["load_pages"] += pages
            return True
        self.stats["load_failures"] += 1
        if isinstance(error, FluxonError):
            self._failed(conn, "load", error)
        else:
            logger.error("fluxon: linker layer-wise load failed: %s: %s", type(error).__name__,
                         error)
        return False

    def _bind_thread(self) -> None:
        bind = getattr(self._ops, "bind_thread", None)
        if bind is not None:
            bind()

    def _load_loop(self) -> None:
        self._bind_thread()
        while True:
            task = self._load_q.get()
            try:
                if task is None:
                    return
                self._run_load(*task)
            finally:
                self._load_q.task_done()

    def _run_load(self, index: int, loads: List[_Load], ready) -> None:
        ops = self._ops
        plans: List[Tuple[_Conn, int]] = []
        launched = False
        conn = None
        try:
            conn = self._get_conn()
            if conn is None:
                raise fluxon.OwnerUnavailableError(f"no owner at {self.config.socket}")
            work = []
            offset = 0
            for ld in loads:
                pages_dev = ops.device_pages(ld.slots, [ready], offload=False, offset=offset)
                offset += len(ld.keys)
                plan = self._open_get(conn, ld)
                plans.append((conn, plan))
                work.append((plan, pages_dev, len(ld.keys)))
            path = ops.layer_path(sum(w[2] for w in work))
            plane = conn.load_plane
            layers, done = self.num_layers, 0
            launched = True
            # Enqueued a few layers at a time, so the first layers can be reported (and used by
            # the forward) while later ones are still being enqueued.
            for begin in range(0, layers, _LAUNCH_LAYERS):
                count = min(_LAUNCH_LAYERS, layers - begin)
                ops.restore_layers(plane, work, begin, count, path, continues=begin > 0)
                while done < begin + count and ops.layer_done(done):
                    self._layer_landed(plane, index, done)
                    done += 1
            for layer in range(done, layers):
                ops.wait_layer(layer)  # this layer's copies finished (load thread, not forward)
                self._layer_landed(plane, index, layer)
        except BaseException as e:  # noqa: BLE001 - reported through the counter, below
            error = e
        else:
            error = None
        finally:
            # On failure the layers not yet completed are failed only after the stream drained
            # and the views went back: finish_layer_wise_loading() then returns once nothing
            # writes the slots any more.
            if launched:
                try:
                    ops.drain(offload=False)  # nothing may still read a plan we release
                except BaseException as e:  # noqa: BLE001
                    logger.exception("fluxon: linker load stream failed")
                    error = error or e
            for ld in loads:
                self._cancel_held(ld.held)
            self._release_plans(plans)
        if error is not None:
            self.layer_done_counter.fail(index, error)
        self._load_verdict(conn, error, sum(len(ld.keys) for ld in loads))

    def _layer_landed(self, plane, index: int, layer: int) -> None:
        """Completes `layer` on the counter once its event fired, unless a kernel reported an
        error (a page index that was not a whole page, a plan that changed): then raises."""
        if plane is not None:
            plane.take_device_errors()
        self.layer_done_counter.complete(index, layer)

    # -- offload ----------------------------------------------------------------------------

    def offload(self, transfers, session_id: Optional[str] = None) -> bool:
        try:
            kv = self._kv(transfers)
            keys = list(kv.keys or [])
            slots = kv.device_indices
            if not keys or slots is None or int(slots.numel()) != len(keys) * self.page_size:
                return False
        except Exception:
            logger.exception("fluxon: linker offload refused")
            return False
        if not self.is_writer:  # rank-replicated KV: the writer rank stores it
            self._offload_results.add(True)
            return True
        try:
            events = self._ops.offload_ready(self)
        except Exception:
            logger.exception("fluxon: record_offload_ready failed")
            return False
        stored = [self.keys.key(k) for k in keys]
        if not self._offload_inline(stored, slots, events):
            self._offload_q.put((stored, slots, events, self._offload_results.add()))
        return True

    def _offload_inline(self, keys: List[str], slots, events) -> bool:
        """Reserves and enqueues the write of a small offload on the caller's thread (False:
        not small, another inline offload in flight, or no connection: the thread takes it).
        Its verdict is added in order: decided now when nothing is left to write or the
        reservation failed, else by _decide_inline once the write finished."""
        ops = self._ops
        limit = self.config.inline_offload_pages
        if limit == 0 or len(keys) > limit or not hasattr(ops, "write_inline"):
            return False
        # One inline offload at a time: its plane's error word then names exactly its write.
        self._offload_results.completed(self._decide_inline)  # commits one that finished
        if self._offload_results.inline_in_flight():
            return False
        with self._lock:
            conn = self._conn
        if conn is None:
            return False
        self.stats["offload_inline"] += 1
        try:
            dev_slots = ops.inline_slots(slots, events, offload=True)
            self._learn_parents(keys)
            with self._lock:
                parent = self._parents.get(keys[0])
            plan, idx = self._reserve_put(conn, keys, list(range(len(keys))), parent)
        except InvalidArgumentError as e:
            logger.error("fluxon: offload: %s", e)
            return self._decided_inline(False, 0)
        except FluxonError as e:
            self._failed(conn, "offload", e)
            return self._decided_inline(False, 0)
        if plan is None:  # every page stored already, or being stored by another writer
            return self._decided_inline(True, len(keys))
        plane = conn.inline_offload_plane
        try:
            if len(idx) == len(keys):  # the kernel derives the pages from the slots
                source = dev_slots
                event = ops.write_inline(plane, plan, source, len(idx), True)
            else:  # some pages are stored already: the indices of the others
                pages_dev = ops.device_pages(dev_slots, [], offload=True, inline=True)
                source = ops.select(pages_dev, idx, inline=True)
                event = ops.write_inline(plane, plan, source, len(idx))
        except BaseException:  # noqa: BLE001
            logger.exception("fluxon: linker offload failed")
            try:
                try:
                    ops.drain_inline(offload=True)
                finally:
                    conn.client.put_abort(plan)  # even when the stream cannot be drained
            except BaseException as e:  # noqa: BLE001
                logger.warning("fluxon: abort of an offload's plan failed: %s", e)
            return self._decided_inline(False, 0)
        self._offload_results.add(
            inline=_InlineOffload(conn, plane, plan, len(keys), event, source))
        return True

    def _decided_inline(self, ok: bool, pages: int) -> bool:
        """An inline offload decided before anything was enqueued: counted, its verdict in
        order. True (offload() took it)."""
        self._count_offload(ok, pages)
        self._offload_results.add(ok)
        return True

    def _decide_inline(self, rec: _InlineOffload, block: bool) -> Optional[bool]:
        """Commits an inline offload whose write finished (aborts it when the write failed or a
        kernel reported an error); None while the write runs and `block` is false."""
        if not block and not rec.event.query():
            return None
        try:
            rec.event.synchronize()
            if rec.plane is not None:
                rec.plane.take_device_errors()  # e.g. a slot row not a whole page
        except BaseException as e:  # noqa: BLE001
            logger.error("fluxon: linker offload failed: %s: %s", type(e).__name__, e)
            try:
                rec.conn.client.put_abort(rec.plan)
            except FluxonError as e2:
                logger.warning("fluxon: abort of an offload's plan failed: %s", e2)
            return self._count_offload(False, 0)
        try:
            rec.conn.client.local_fast_put_commit(rec.plan)  # locally readable once it returns
        except FluxonError as e:
            self._failed(rec.conn, "offload", e)
            return self._count_offload(False, 0)
        return self._count_offload(True, rec.pages)

    def _count_offload(self, ok: bool, pages: int) -> bool:
        """Counts an offload's verdict (`pages` stored when it succeeded); returns `ok`."""
        self.stats["offload" if ok else "offload_failures"] += 1
        if ok:
            self.stats["offload_pages"] += pages
        return ok

    def _offload_loop(self) -> None:
        self._bind_thread()
        while True:
            task = self._offload_q.get()
            try:
                if task is None:
                    return
                keys, slots, events, rec = task
                ok = False
                try:
                    ok = self._run_offload(keys, slots, events)  # counts the pages it stored
                except BaseException:  # noqa: BLE001
                    logger.exception("fluxon: linker offload failed")
                self._offload_results.set(rec, self._count_offload(ok, 0))
            finally:
                self._offload_q.task_done()

    def _run_offload(self, keys: List[str], slots, events) -> bool:
        ops = self._ops
        conn = self._get_conn()
        if conn is None:
            return False
        try:
            pages_dev = ops.device_pages(slots, events, offload=True)
        except InvalidArgumentError as e:
            logger.error("fluxon: offload: %s", e)
            return False
        self._learn_parents(keys)
        with self._lock:
            parent = self._parents.get(keys[0])
        todo = list(range(len(keys)))
        try:
            for start in range(0, len(todo), fluxon.MAX_BATCH_KEYS):
                chunk = todo[start:start + fluxon.MAX_BATCH_KEYS]
                self._put_chunk(conn, keys, pages_dev, chunk, parent if start == 0 else None)
        except FluxonError as e:
            self._failed(conn, "offload", e)
            return False
        self.stats["offload_pages"] += len(keys)
        return True

    def _reserve_put(self, conn: _Conn, keys, idx: List[int],
                     parent) -> Tuple[Optional[int], List[int]]:
        """A put plan over keys[idx] not stored yet, and those indices; (None, []) when every one
        is stored (or being stored by another writer). Raises FluxonError when some could not be
        reserved. The plan is reserved while the GPU may still be finishing the forward's
        writes."""
        for _ in range(_MAX_PUT_ROUNDS):
            if not idx:
                return None, []
            first = idx[0]
            opts = fluxon.PutOptionalArgs(parent_key=keys[first - 1] if first > 0 else parent)
            try:
                return conn.client.local_fast_put_start([keys[i] for i in idx],
                                                        self.view.value_len, opts), idx
            except KeyConflictError as e:
                bad = {idx[j] for j in e.conflict_indices}
                idx = [i for i in idx if i not in bad]  # stored, or being stored by another
        if idx:
            raise fluxon.PlanStateError(f"{len(idx)} pages kept conflicting")
        return None, []

    def _put_chunk(self, conn: _Conn, keys, pages_dev, idx: List[int], parent) -> None:
        """Stores keys[idx] not stored yet; raises FluxonError when some could not be stored."""
        ops = self._ops
        plan, idx = self._reserve_put(conn, keys, idx, parent)
        if plan is None:
            return
        try:
            # All of them (the usual case): the indices already on the device serve.
            sub = pages_dev if len(idx) == len(keys) else ops.select(pages_dev, idx)
            ops.write(conn.offload_plane, plan, sub, len(idx))
            ops.finish_offload()  # the write finished
            if conn.offload_plane is not None:
                conn.offload_plane.take_device_errors()  # e.g. a slot row not a whole page
        except BaseException:
            try:
                ops.drain(offload=True)
            finally:
                conn.client.put_abort(plan)
            raise
        conn.client.local_fast_put_commit(plan)  # locally readable once this returns

    def num_completed_offloads(self) -> int:
        return self._offload_results.completed(self._decide_inline)

    def pop_completed_offload(self) -> bool:
        return self._offload_results.pop()

    # -- MLA dedup (rank 0 reads, broadcasts each layer; SGLang's Mooncake linker's scheme) -----

    def _setup_mla_dedup(self, kvcache, params) -> None:
        from sglang.srt.mem_cache.mla_host_dedup import MLAHostDedupBroadcaster
        self._tp_group = getattr(params, "attn_tp_cache_group", None) or \
            getattr(params, "tp_cache_group", None)
        self.mla_broadcaster = MLAHostDedupBroadcaster.build(
            kvcache, params.tp_cache_group, getattr(params, "attn_tp_cache_group", None))
        logger.info("fluxon: MLA linker dedup: rank 0 loads, tp_rank=%d/%d", self.ident.tp_rank,
                    self.ident.tp_size)

    def _agree_on_broadcast(self):
        import hashlib
        import torch
        with self._lock:
            plan = [(rid, list(ld.keys)) for rid, ld in self._pending.items()]
        digest = hashlib.sha256(repr(plan).encode()).digest()
        digests = [None] * torch.distributed.get_world_size(self._tp_group)
        torch.distributed.all_gather_object(digests, digest, group=self._tp_group)
        if any(d != digest for d in digests):
            logger.warning("fluxon: MLA linker load plans differ; every rank reads")
            return None
        return self.mla_broadcaster

    def _prepare_broadcast(self, index, pending, ready, broadcaster) -> None:
        import torch
        slots = torch.cat([ld.slots for ld in pending])
        prepared = broadcaster.prepare_broadcast(slots, torch.cuda.current_stream())
        self.broadcast_loads[index] = (0, prepared, ready)

    def _broadcast_loaded_layers(self, index: int, threshold: int) -> None:
        batch = self.broadcast_loads.get(index)
        if batch is None:
            return
        import torch
        first, prepared, ready = batch
        if first == 0:
            torch.cuda.current_stream().wait_event(ready)
        for layer in range(first, threshold + 1):
            self.mla_broadcaster.broadcast_loaded_layer(layer, prepared)
        if threshold == self.num_layers - 1:
            del self.broadcast_loads[index]
        else:
            self.broadcast_loads[index] = (max(first, threshold + 1), prepared, ready)

    # -- lifecycle --------------------------------------------------------------------------

    def reset(self) -> None:
        """Quiesces every load and offload and drops queued work, lookup handles and results."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
            held, self._held = list(self._held.values()), OrderedDict()
        for ld in pending:
            self._cancel_held(ld.held)
        for h in held:
            self._cancel_held(h)
        self._load_q.join()
        for finish in self.layer_done_counter.take_enqueued():
            finish()  # batches enqueued inline that nobody finished: views back
        self._offload_q.join()
        self._offload_results.clear(self._decide_inline)  # inline writes committed or aborted
        self.broadcast_loads.clear()
        self.layer_done_counter.reset()

    def close(self) -> None:
        """reset(), then stops the threads and releases the client and CUDA registrations."""
        if self._closed:
            return
        self.reset()
        for q, t in ((self._load_q, self._load_thread), (self._offload_q, self._offload_thread)):
            if t.is_alive():
                q.put(None)
                t.join()
        with self._lock:
            conns = ([self._conn] if self._conn is not None else []) + self._retired
            self._conn, self._retired = None, []
        for conn in conns:
            conn.release()
        if self.mla_broadcaster is not None:
            self.mla_broadcaster.destroy()
        self._closed = True
        logger.info("fluxon: linker stats: %s", self.stats)

