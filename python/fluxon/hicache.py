"""Fluxon as a KV page store for an inference engine's host KV pool (torch- and SGLang-free core).

`fluxon.sglang` adapts this to SGLang's ``HiCacheStorage``; everything that can be tested without
SGLang or torch lives here:

* **Geometry** (`PoolGeometry.probe`): what one page of the host pool is. A page is the list of
  buffers ``pool.get_page_buffer_meta(indices)`` gives for it, and its Fluxon value is the
  concatenation of those buffers in that order (K and V together; every layer for layer_first).
* **Keys** (`KeyScheme`): ``<namespace>:<page_hash>_<fingerprint>_<rank>``. The fingerprint hashes
  everything that changes a page's bytes (model, layout, dtype, page size, KV shape, PP stage,
  bytes per page), so a page written under one layout can never be read under another: it is
  simply a miss. ``<rank>`` is ``t<tp_rank>.<tp_size>`` for per-rank KV (MHA) and ``mla`` for
  rank-replicated KV (MLA), which every TP rank reads while only the writer rank writes.
* **Store** (`PageStore`): prefix ``exists``, page get/put through the native multi-threaded
  scatter/gather copy (``fluxon.copy_segments_*``), conflict handling, reconnection and stats.

Invariants: data methods never raise for owner trouble (a `FluxonError` becomes a miss or False,
is logged and counted, and the next call reconnects); bad configuration raises at `attach`.
"""

from __future__ import annotations

import hashlib
import os
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

import fluxon
from fluxon.errors import FluxonError, InvalidArgumentError, KeyConflictError

logger = logging.getLogger(__name__)

SUPPORTED_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
# Pool attributes that shape a page's bytes; whichever a pool has go into the fingerprint.
_SHAPE_ATTRS = ("layer_num", "head_num", "head_dim", "kv_cache_dim", "kv_lora_rank",
                "qk_rope_head_dim", "v_head_dim")


def _dtype_name(dtype) -> str:
    s = str(getattr(dtype, "name", None) or dtype)
    return s.replace("torch.", "")


def _int_attr(obj, name: str) -> Optional[int]:
    v = getattr(obj, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class PoolGeometry:
    """One host pool's page shape, read once at registration.

    ``segment_sizes`` are the byte sizes of one page's buffers in ``get_page_buffer_meta`` order;
    ``page_bytes`` (their sum) is the Fluxon value length of every page.
    """

    layout: str
    dtype: str
    page_size: int
    shape: Tuple[Tuple[str, int], ...]
    segment_sizes: Tuple[int, ...]

    @property
    def segs_per_page(self) -> int:
        return len(self.segment_sizes)

    @property
    def page_bytes(self) -> int:
        return sum(self.segment_sizes)

    @classmethod
    def probe(cls, pool, expect_page_size: Optional[int] = None) -> "PoolGeometry":
        """Validates `pool` and measures one page; raises InvalidArgumentError on anything unusable."""
        layout = getattr(pool, "layout", None)
        if layout not in SUPPORTED_LAYOUTS:
            raise InvalidArgumentError(
                f"host pool layout {layout!r} is not supported by the Fluxon backend "
                f"(supported: {', '.join(SUPPORTED_LAYOUTS)})")
        page_size = _int_attr(pool, "page_size")
        if page_size is None or page_size <= 0:
            raise InvalidArgumentError(f"host pool page_size must be a positive int, got "
                                       f"{getattr(pool, 'page_size', None)!r}")
        if expect_page_size is not None and expect_page_size != page_size:
            raise InvalidArgumentError(
                f"extra-config page_size={expect_page_size} but the host pool's page_size is "
                f"{page_size}")
        if getattr(pool, "dtype", None) is None:
            raise InvalidArgumentError("host pool has no dtype")
        if not callable(getattr(pool, "get_page_buffer_meta", None)):
            raise InvalidArgumentError("host pool has no get_page_buffer_meta (zero-copy metadata)")
        probe_len = _int_attr(pool, "logical_page_size") or page_size
        ptrs, sizes = pool.get_page_buffer_meta(np.arange(probe_len, dtype=np.int64))
        ptrs, sizes = list(ptrs), [int(s) for s in sizes]
        if not ptrs or len(ptrs) != len(sizes) or any(s <= 0 for s in sizes):
            raise InvalidArgumentError(
                f"host pool returned unusable page metadata ({len(ptrs)} pointers, sizes {sizes})")
        page_bytes = sum(sizes)
        if page_bytes > fluxon.MAX_VALUE_LEN:
            raise InvalidArgumentError(
                f"one page is {page_bytes} bytes, over Fluxon's {fluxon.MAX_VALUE_LEN}-byte value "
                f"limit: use a smaller page size")
        per_token = getattr(pool, "get_size_per_token", None)
        if callable(per_token) and probe_len == page_size:
            expect = int(per_token()) * page_size
            if expect != page_bytes:
                raise InvalidArgumentError(
                    f"page metadata covers {page_bytes} bytes but page_size={page_size} x "
                    f"{int(per_token())} bytes/token = {expect}: page size or layout mismatch")
        shape = tuple((a, _int_attr(pool, a)) for a in _SHAPE_ATTRS if _int_attr(pool, a))
        return cls(layout, _dtype_name(pool.dtype), page_size, shape, tuple(sizes))


@dataclass(frozen=True)
class RankIdentity:
    """Which shard of the model's KV this process holds (from HiCacheStorageConfig)."""

    model: str = ""
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    dcp_rank: int = 0
    dcp_size: int = 1
    is_mla: bool = False

    def __post_init__(self):
        for r, n in (("tp_rank", "tp_size"), ("pp_rank", "pp_size"), ("cp_rank", "cp_size"),
                     ("dcp_rank", "dcp_size")):
            rv, nv = getattr(self, r), getattr(self, n)
            if not isinstance(rv, int) or not isinstance(nv, int) or nv < 1 or not 0 <= rv < nv:
                raise InvalidArgumentError(f"bad {r}/{n}: {rv!r}/{nv!r}")

    @property
    def is_writer(self) -> bool:
        """MHA: every rank writes its own shard. MLA: one writer per DCP shard (TP rank == dcp rank)."""
        return not self.is_mla or self.tp_rank == self.dcp_rank


@dataclass(frozen=True)
class KeyScheme:
    """Maps engine page hashes to Fluxon keys (see the module docstring)."""

    namespace: str
    fingerprint: str
    rank_tag: str

    @classmethod
    def build(cls, namespace: str, ident: RankIdentity, kind: str, geometry_parts) -> "KeyScheme":
        desc = repr((kind, ident.model, ident.pp_rank, ident.pp_size, ident.cp_rank,
                     ident.cp_size, tuple(geometry_parts)))
        fp = hashlib.sha256(desc.encode()).hexdigest()[:16]
        if ident.is_mla:
            rank = "mla" if ident.dcp_size == 1 else f"mla.d{ident.dcp_rank}.{ident.dcp_size}"
        else:
            rank = f"t{ident.tp_rank}.{ident.tp_size}"
        return cls(namespace, fp, rank)

    def key(self, page_hash: str) -> str:
        if not isinstance(page_hash, str) or not page_hash:
            raise InvalidArgumentError(f"page hash must be a non-empty str, got {page_hash!r}")
        return f"{self.namespace}:{page_hash}_{self.fingerprint}_{self.rank_tag}"


@dataclass
class _Stats:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)  # GB/s per call
    backup_bandwidth: List[float] = field(default_factory=list)
    errors: int = 0
    reconnects: int = 0
    publish_failures: int = 0


class PageStore:
    """Pages of `page_bytes` bytes under one `KeyScheme`, moved by the native copy.

    Thread-safe: the engine's prefetch and backup threads call it concurrently. The KvClient is
    shared; it is replaced (under a lock) after an owner failure.
    """

    _MAX_PUT_ROUNDS = 4

    def __init__(self, socket_path: str, copy_threads: int = 4, reconnect_interval_s: float = 1.0,
                 deferred_exists: bool = True):
        self.socket_path = socket_path
        self.copy_threads = copy_threads
        self.reconnect_interval_s = reconnect_interval_s
        # exists_prefix asks for a deferred answer: pages another owner holds count once the
        # owner's master lookup routes them, and their fetch runs on after the answer (the handle
        # is cancelled; the fetched copies stay), so the get that follows finds them here or
        # joins that fetch instead of the check waiting for a remote read it then throws away.
        self.deferred_exists = deferred_exists
        self._lock = threading.Lock()
        self._client: Optional[fluxon.KvClient] = fluxon.KvClient(socket_path=socket_path)
        self._last_connect = time.monotonic()
        self._pending: list = []  # KvFutures of commits not yet known published
        self._stats = _Stats()

    # -- connection -------------------------------------------------------------------------

    def _get_client(self) -> Optional[fluxon.KvClient]:
        with self._lock:
            if self._client is not None:
                return self._client
            now = time.monotonic()
            if now - self._last_connect < self.reconnect_interval_s:
                return None
            self._last_connect = now
            try:
                self._client = fluxon.KvClient(socket_path=self.socket_path)
                self._stats.reconnects += 1
                logger.info("fluxon: reconnected to %s", self.socket_path)
            except FluxonError as e:
                logger.warning("fluxon: owner at %s still unreachable: %s", self.socket_path, e)
            return self._client

    def _failed(self, client, what: str, e: Exception) -> None:
        logger.warning("fluxon: %s failed (%s): %s", what, type(e).__name__, e)
        with self._lock:
            self._stats.errors += 1
            if self._client is client and not isinstance(e, (InvalidArgumentError,
                                                              fluxon.NoSpaceError)):
                self._client = None  # reconnect on a later call
                self._pending = []

    def close(self) -> None:
        with self._lock:
            self._client = None
            self._pending = []

    def delete_prefix(self, prefix: str) -> Tuple[int, int]:
        """Deletes the stored pages under `prefix`: (deleted, kept because in use); (0, 0) on
        owner trouble."""
        c = self._get_client()
        if c is None:
            return 0, 0
        try:
            return c.delete_prefix(prefix)
        except FluxonError as e:
            self._failed(c, "delete_prefix", e)
            return 0, 0

    # -- data path --------------------------------------------------------------------------

    def exists_prefix(self, keys: Sequence[str]) -> int:
        """Number of leading keys that are stored (0 on owner trouble). With `deferred_exists`,
        pages held by another owner count as stored and are being fetched here when this returns;
        one that cannot be fetched is a miss of the get that follows."""
        if not keys:
            return 0
        c = self._get_client()
        if c is None:
            return 0
        try:
            h = c.get_start(list(keys), allow_deferred=self.deferred_exists)
            n = h.result.raw_prefix_hit_len
            c.cancel_get_transfer(h)
            return n
        except FluxonError as e:
            self._failed(c, "exists", e)
            return 0

    def get_pages(self, keys: Sequence[str], seg_ptrs: Sequence[int], seg_sizes: Sequence[int],
                  segs_per_value: int, value_len: int) -> List[bool]:
        """Fills the segments of the longest stored prefix of `keys`; True for each page filled.

        The result is always a run of True followed by False (a prefix).
        """
        n = len(keys)
        if n == 0:
            return []
        _check_segments(n, seg_ptrs, seg_sizes, segs_per_value)
        c = self._get_client()
        if c is None:
            return [False] * n
        t0 = time.perf_counter()
        try:
            h = c.get_start(list(keys), transfer=True)  # one round trip: get_transfer is local
            got = h.result.transferable_len
            if got == 0:
                c.cancel_get_transfer(h)
                return [False] * n
            plan = c.get_transfer(h)
            try:
                k = got * segs_per_value
                fluxon.copy_segments_from_plan(plan, seg_ptrs[:k], seg_sizes[:k], segs_per_value,
                                               value_len, self.copy_threads)
            finally:
                c.release_views(plan)
        except FluxonError as e:
            self._failed(c, "get", e)
            return [False] * n
        self._record(self._stats.prefetch_pgs, self._stats.prefetch_bandwidth, got,
                     got * value_len, time.perf_counter() - t0)
        return [True] * got + [False] * (n - got)

    def put_pages(self, keys: Sequence[str], seg_ptrs: Sequence[int], seg_sizes: Sequence[int],
                  segs_per_value: int, value_len: int,
                  atomic_group_lens: Optional[Sequence[int]] = None,
                  parent_key: Optional[str] = None) -> List[bool]:
        """Stores the pages whose keys are not stored yet; True for each page now stored.

        Keys already stored (or being stored by another writer) are skipped and count as stored.
        With `atomic_group_lens`, a group with any conflicting key is skipped whole (its other
        keys report False): a group is never split across two puts. `parent_key`: the stored
        key of the page before keys[0] (the owner evicts a chain from its tail).
        """
        n = len(keys)
        if n == 0:
            return []
        _check_segments(n, seg_ptrs, seg_sizes, segs_per_value)
        groups = list(atomic_group_lens) if atomic_group_lens else [1] * n
        if sum(groups) != n or any(g <= 0 for g in groups):
            raise InvalidArgumentError(f"atomic_group_lens {groups} do not cover {n} keys")
        c = self._get_client()
        if c is None:
            return [False] * n
        self._reap(c)
        result = [False] * n
        # Groups still to write, as (start, len).
        todo, s = [], 0
        for g in groups:
            todo.append((s, g))
            s += g
        t0 = time.perf_counter()
        written = 0
        try:
            for _ in range(self._MAX_PUT_ROUNDS):
                if not todo:
                    break
                idx = [i for st, g in todo for i in range(st, st + g)]
                opts = fluxon.PutOptionalArgs(
                    atomic_group_lens=[g for _, g in todo] if atomic_group_lens else None,
                    parent_key=keys[idx[0] - 1] if idx[0] > 0 else parent_key)
                try:
                    plan = c.local_fast_put_start([keys[i] for i in idx], value_len, opts)
                except KeyConflictError as e:
                    bad = {idx[j] for j in e.conflict_indices}
                    for i in bad:
                        result[i] = True  # stored already, or being stored by another writer
                    todo = [(st, g) for st, g in todo if not bad & set(range(st, st + g))]
                    continue
                try:
                    ptrs = [seg_ptrs[i * segs_per_value + j] for i in idx
                            for j in range(segs_per_value)]
                    sizes = [seg_sizes[i * segs_per_value + j] for i in idx
                             for j in range(segs_per_value)]
                    fluxon.copy_segments_to_plan(plan, ptrs, sizes, segs_per_value, value_len,
                                                 self.copy_threads)
                except BaseException:
                    c.put_abort(plan)
                    raise
                fut = c.local_fast_put_commit(plan)  # locally readable at once
                with self._lock:
                    self._pending.append(fut)
                for i in idx:
                    result[i] = True
                written = len(idx)
                break
        except FluxonError as e:
            self._failed(c, "put", e)
            return [False] * n
        if written:
            self._record(self._stats.backup_pgs, self._stats.backup_bandwidth, written,
                         written * value_len, time.perf_counter() - t0)
        return result

    # -- stats ------------------------------------------------------------------------------

    def _reap(self, c) -> None:
        """Counts commits whose route publish failed (they stay locally readable)."""
        with self._lock:
            pending, self._pending = self._pending, []
        keep = []
        for f in pending:
            if f.done():
                if f.exception() is not None:
                    self._stats.publish_failures += 1
            else:
                keep.append(f)
        with self._lock:
            self._pending = keep + self._pending

    def _record(self, pgs: list, bw: list, pages: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            pgs.append(pages)
            bw.append(nbytes / max(seconds, 1e-9) / 1e9)

    def take_stats(self) -> _Stats:
        """Returns the counters since the last call and starts new ones (error counts persist)."""
        with self._lock:
            s = self._stats
            self._stats = _Stats(errors=s.errors, reconnects=s.reconnects,
                                 publish_failures=s.publish_failures)
            return s


def _check_segments(n: int, seg_ptrs, seg_sizes, segs_per_value: int) -> None:
    if segs_per_value <= 0 or len(seg_ptrs) != n * segs_per_value or len(seg_sizes) != len(seg_ptrs):
        raise InvalidArgumentError(
            f"{n} pages need {n} x {segs_per_value} segments, got {len(seg_ptrs)} pointers and "
            f"{len(seg_sizes)} sizes")


# ----------------------------------------------------------------------------------------------
# The HiCacheStorage behaviour, torch-free. fluxon.sglang mixes it into SGLang's ABC.

_OUR_EXTRA_KEYS = ("socket", "namespace", "copy_threads", "reconnect_interval_s", "page_size",
                   "deferred_exists")


def _extra_str(extra: dict, name: str, default: str) -> str:
    v = extra.get(name, default)
    if not isinstance(v, str) or not v:
        raise InvalidArgumentError(f"extra-config {name!r} must be a non-empty string, got {v!r}")
    return v


def _cfg_int(cfg, name: str, default: int) -> int:
    v = getattr(cfg, name, default)
    return default if v is None else int(v)


class FluxonHiCacheBackend:
    """SGLang HiCache storage semantics over Fluxon (see `fluxon.sglang.FluxonHiCacheStorage`).

    * Constructed as ``cls(storage_config, *args, **kwargs)``; config fields are read with
      defaults because they differ between SGLang releases. Extra-config keys of ours:
      ``socket`` (owner socket; default ``$FLUXON_SOCKET`` or fluxon.DEFAULT_SOCKET_PATH),
      ``namespace`` (key prefix, default ``"sglang"``), ``copy_threads`` (default 4),
      ``reconnect_interval_s`` (default 1.0), ``page_size`` (optional expected page size),
      ``deferred_exists`` (default true: ``batch_exists`` counts pages another owner holds as
      soon as they are routed, and their fetch overlaps the time until ``batch_get_v1``).
    * `register_mem_pool_host` validates the pool and connects; every configuration problem
      (unsupported layout, page-size mismatch, owner not running) raises there.
    * Zero-copy (``interface_v1``): one Fluxon value per page = the page's buffers concatenated
      in ``get_page_buffer_meta`` order. Legacy byte methods store the flat page tensors SGLang
      hands them under separate keys (``flat<nbytes>`` in the fingerprint), so the two paths
      never read each other's bytes.
    * Rank-replicated KV (MLA): only the writer rank stores; writes on other ranks report
      success without storing; every rank reads the same key.
    """

    def __init__(self, storage_config=None, *args, **kwargs):
        extra = getattr(storage_config, "extra_config", None) or {}
        if not isinstance(extra, dict):
            raise InvalidArgumentError("extra_config must be a dict")
        self._socket = _extra_str(extra, "socket",
                                  os.environ.get("FLUXON_SOCKET",
                                                               fluxon.DEFAULT_SOCKET_PATH))
        self._namespace = _extra_str(extra, "namespace", "sglang")
        if ":" in self._namespace:
            raise InvalidArgumentError(f"namespace {self._namespace!r} must not contain ':'")
        self._copy_threads = extra.get("copy_threads", 4)
        if isinstance(self._copy_threads, bool) or not isinstance(self._copy_threads, int) \
                or not 1 <= self._copy_threads <= 64:
            raise InvalidArgumentError(f"copy_threads must be an int in [1, 64], got "
                                       f"{self._copy_threads!r}")
        self._reconnect_s = extra.get("reconnect_interval_s", 1.0)
        if isinstance(self._reconnect_s, bool) or not isinstance(self._reconnect_s, (int, float)) \
                or self._reconnect_s < 0:
            raise InvalidArgumentError(f"reconnect_interval_s must be >= 0, got "
                                       f"{self._reconnect_s!r}")
        self._deferred_exists = extra.get("deferred_exists", True)
        if not isinstance(self._deferred_exists, bool):
            raise InvalidArgumentError(f"deferred_exists must be true or false, got "
                                       f"{self._deferred_exists!r}")
        self._expect_page_size = extra.get("page_size")
        if self._expect_page_size is not None and (
                isinstance(self._expect_page_size, bool)
                or not isinstance(self._expect_page_size, int) or self._expect_page_size <= 0):
            raise InvalidArgumentError(f"page_size must be a positive int, got "
                                       f"{self._expect_page_size!r}")
        if getattr(storage_config, "should_split_heads", False):
            raise InvalidArgumentError("split-heads (heterogeneous TP, page_head) is not supported")
        self._zero_copy = bool(extra.get("interface_v1", False))
        self._ident = RankIdentity(
            model=str(getattr(storage_config, "model_name", None) or "").replace("/", "-"),
            tp_rank=_cfg_int(storage_config, "tp_rank", 0),
            tp_size=_cfg_int(storage_config, "tp_size", 1),
            pp_rank=_cfg_int(storage_config, "pp_rank", 0),
            pp_size=_cfg_int(storage_config, "pp_size", 1),
            cp_rank=_cfg_int(storage_config, "attn_cp_rank", 0),
            cp_size=_cfg_int(storage_config, "attn_cp_size", 1),
            dcp_rank=_cfg_int(storage_config, "dcp_rank", 0),
            dcp_size=_cfg_int(storage_config, "dcp_size", 1),
            is_mla=bool(getattr(storage_config, "is_mla_model", False)),
        )
        self._store: Optional[PageStore] = None
        self._geom: Optional[PoolGeometry] = None
        self._keys: Optional[KeyScheme] = None
        self._flat_keys: dict = {}

    # -- registration -----------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Validates the host pool, connects to the owner, and fixes the key namespace."""
        geom = PoolGeometry.probe(mem_pool_host, self._expect_page_size)
        try:
            store = PageStore(self._socket, self._copy_threads, float(self._reconnect_s),
                              self._deferred_exists)
        except FluxonError as e:
            raise type(e)(f"Fluxon HiCache backend: cannot reach the owner at {self._socket!r} "
                          f"(is fluxond running? set extra-config 'socket'): {e}") from e
        self.mem_pool_host = mem_pool_host
        self._geom = geom
        self._keys = KeyScheme.build(self._namespace, self._ident, "page", self._geom_parts())
        if self._store is not None:
            self._store.close()
        self._store = store
        logger.info("fluxon: HiCache backend on %s: layout=%s dtype=%s page_size=%d, %d buffers "
                    "and %d bytes per page, keys %s:<hash>_%s_%s", self._socket, geom.layout,
                    geom.dtype, geom.page_size, geom.segs_per_page, geom.page_bytes,
                    self._namespace, self._keys.fingerprint, self._keys.rank_tag)

    def _geom_parts(self):
        g = self._geom
        return (g.layout, g.dtype, g.page_size, g.shape, g.segment_sizes)

    def _ready(self) -> PageStore:
        if self._store is None:
            raise RuntimeError("Fluxon HiCache backend used before register_mem_pool_host")
        return self._store

    def _flat_scheme(self, nbytes: int) -> KeyScheme:
        s = self._flat_keys.get(nbytes)
        if s is None:
            s = KeyScheme.build(self._namespace, self._ident, f"flat{nbytes}", self._geom_parts())
            self._flat_keys[nbytes] = s
        return s

    def storage_key(self, page_hash: str) -> str:
        """The Fluxon key of a page hash on the zero-copy path (for tools and tests)."""
        self._ready()
        return self._keys.key(page_hash)

    # -- zero-copy (v1) ---------------------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        """Number of leading `keys` stored (prefix length, not a count)."""
        store = self._ready()
        if not keys:
            return 0
        if self._zero_copy:
            ks = [self._keys.key(k) for k in keys]
        else:
            ks = [self._flat_scheme(self._geom.page_bytes).key(k) for k in keys]
        return store.exists_prefix(ks)

    def _page_segments(self, keys, host_indices):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        ptrs, sizes = [int(p) for p in ptrs], [int(s) for s in sizes]
        spp = self._geom.segs_per_page
        if len(ptrs) != len(keys) * spp:
            raise InvalidArgumentError(
                f"{len(keys)} keys but the pool gave {len(ptrs)} buffers ({spp} per page)")
        return ptrs, sizes

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Fills the host-pool pages at `host_indices` from storage; a True prefix, then False."""
        store = self._ready()
        if not keys:
            return []
        try:
            ptrs, sizes = self._page_segments(keys, host_indices)
        except InvalidArgumentError as e:
            logger.error("fluxon: batch_get_v1: %s", e)
            return [False] * len(keys)
        return store.get_pages([self._keys.key(k) for k in keys], ptrs, sizes,
                               self._geom.segs_per_page, self._geom.page_bytes)

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Stores the host-pool pages at `host_indices`; pages already stored count as stored."""
        store = self._ready()
        if not keys:
            return []
        if not self._ident.is_writer:
            return [True] * len(keys)  # rank-replicated KV: the writer rank stores it
        try:
            ptrs, sizes = self._page_segments(keys, host_indices)
        except InvalidArgumentError as e:
            logger.error("fluxon: batch_set_v1: %s", e)
            return [False] * len(keys)
        stored = [self._keys.key(k) for k in keys]
        return store.put_pages(stored, ptrs, sizes, self._geom.segs_per_page,
                               self._geom.page_bytes,
                               parent_key=self._parent_key(extra_info, stored))

    def _parent_key(self, extra_info, stored_keys) -> Optional[str]:
        """The stored key of the page before the batch: the last of SGLang's prefix_keys."""
        prefix = getattr(extra_info, "prefix_keys", None)
        if not prefix or not isinstance(prefix[-1], str) or not prefix[-1]:
            return None
        parent = self._keys.key(prefix[-1])
        return None if parent in stored_keys else parent

    # -- legacy byte methods ----------------------------------------------------------------

    def _alloc_flat_page(self):
        dummy = getattr(self.mem_pool_host, "get_dummy_flat_data_page", None)
        if callable(dummy):
            return dummy()
        return np.empty(self._geom.page_bytes, dtype=np.uint8)

    def _buffers(self, n, targets, sizes):
        """(objects, ptrs, nbytes) of `n` legacy buffers: tensors, numpy arrays or raw pointers."""
        if targets is None:
            objs = [self._alloc_flat_page() for _ in range(n)]
        else:
            objs = list(targets)
            if len(objs) != n:
                raise InvalidArgumentError(f"{n} keys but {len(objs)} buffers")
        ptrs, nbytes = [], []
        for i, o in enumerate(objs):
            if isinstance(o, int) and not isinstance(o, bool):
                if sizes is None:
                    raise InvalidArgumentError("raw pointer buffers need target_sizes")
                ptrs.append(o)
                nbytes.append(int(sizes[i]))
            elif isinstance(o, np.ndarray):
                if not o.flags.c_contiguous:
                    raise InvalidArgumentError(f"buffer {i} is not contiguous")
                ptrs.append(o.ctypes.data)
                nbytes.append(o.nbytes)
            elif hasattr(o, "data_ptr"):
                if not o.is_contiguous():
                    raise InvalidArgumentError(f"buffer {i} is not contiguous")
                if getattr(getattr(o, "device", None), "type", "cpu") != "cpu":
                    raise InvalidArgumentError(f"buffer {i} is not in host memory")
                ptrs.append(o.data_ptr())
                nbytes.append(o.numel() * o.element_size())
            else:
                raise InvalidArgumentError(f"buffer {i}: unsupported type {type(o).__name__}")
        return objs, ptrs, nbytes

    def batch_get(self, keys: List[str], target_locations=None, target_sizes=None):
        """Legacy read: one flat buffer per key; the filled buffer, or None, per key (prefix)."""
        store = self._ready()
        try:
            objs, ptrs, nbytes = self._buffers(len(keys), target_locations, target_sizes)
        except InvalidArgumentError as e:
            logger.error("fluxon: batch_get: %s", e)
            return [None] * len(keys)
        out = [None] * len(keys)
        i = 0
        while i < len(keys):  # runs of equal-size buffers share one call
            j = i
            while j < len(keys) and nbytes[j] == nbytes[i]:
                j += 1
            scheme = self._flat_scheme(nbytes[i])
            ok = store.get_pages([scheme.key(k) for k in keys[i:j]], ptrs[i:j], nbytes[i:j], 1,
                                 nbytes[i])
            for d, hit in enumerate(ok):
                if hit:
                    out[i + d] = objs[i + d]
            if not all(ok):
                break
            i = j
        return out

    def get(self, key: str, target_location=None, target_sizes=None):
        return self.batch_get([key], None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])[0]

    def batch_set(self, keys: List[str], values=None, target_locations=None,
                  target_sizes=None) -> bool:
        """Legacy write of one flat buffer per key; True only if every key is stored."""
        store = self._ready()
        if not keys:
            return True
        if not self._ident.is_writer:
            return True
        src = values if values is not None else target_locations
        if src is None:
            logger.error("fluxon: batch_set without values")
            return False
        try:
            _, ptrs, nbytes = self._buffers(len(keys), src, target_sizes)
        except InvalidArgumentError as e:
            logger.error("fluxon: batch_set: %s", e)
            return False
        ok = True
        i = 0
        while i < len(keys):
            j = i
            while j < len(keys) and nbytes[j] == nbytes[i]:
                j += 1
            scheme = self._flat_scheme(nbytes[i])
            ok &= all(store.put_pages([scheme.key(k) for k in keys[i:j]], ptrs[i:j],
                                      nbytes[i:j], 1, nbytes[i]))
            i = j
        return ok

    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])

    def exists(self, key: str) -> bool:
        """Legacy: is a flat page of the registered pool's page size stored under `key`?"""
        store = self._ready()
        return store.exists_prefix([self._flat_scheme(self._geom.page_bytes).key(key)]) == 1

    # -- management -------------------------------------------------------------------------

    def clear(self) -> None:
        """Deletes every page stored under this backend's namespace (all layouts and ranks).

        Pages a reader holds at that moment stay (they are counted in the log line); pages
        written afterwards are stored as usual."""
        if self._store is None:
            return
        deleted, in_use = self._store.delete_prefix(f"{self._namespace}:")
        logger.info("fluxon: clear(): deleted %d pages under namespace %r (%d in use, kept)",
                    deleted, self._namespace, in_use)

    def get_stats(self):
        """Pages and GB/s per prefetch/backup call since the last call (StorageMetrics fields)."""
        if self._store is None:
            return None
        return self._store.take_stats()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
