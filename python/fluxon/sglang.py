"""SGLang HiCache L3 storage backend backed by Fluxon.

Load it through SGLang's dynamic backend path::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "fluxon",
        "module_path": "fluxon.sglang", "class_name": "FluxonHiCacheStorage",
        "interface_v1": 1, "socket": "/tmp/fluxon/owner.sock", "namespace": "prod"}'

Everything it does is in `fluxon.hicache.FluxonHiCacheBackend` (torch-free, tested without
SGLang); this module only mixes that into SGLang's ``HiCacheStorage`` ABC and turns stats into
SGLang's ``StorageMetrics``. Importing it needs ``sglang`` (and therefore torch).

It also re-exports `fluxon.sglang_linker.FluxonLinker`, SGLang's direct device <-> store path
(``--unified-cache-external-linker-backend dynamic``), so one module names both entry points.
"""

from __future__ import annotations

import logging

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from fluxon.errors import InvalidArgumentError
from fluxon.hicache import FluxonHiCacheBackend
from fluxon.sglang_linker import FluxonLinker

logger = logging.getLogger(__name__)

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except Exception:  # older releases keep it elsewhere; plain stats objects work too
    StorageMetrics = None

__all__ = ["FluxonHiCacheStorage", "FluxonLinker"]


class FluxonHiCacheStorage(FluxonHiCacheBackend, HiCacheStorage):
    """SGLang ``HiCacheStorage`` over a Fluxon owner (see FluxonHiCacheBackend for semantics)."""

    def __init__(self, storage_config, *args, **kwargs):
        FluxonHiCacheBackend.__init__(self, storage_config, *args, **kwargs)
        # SGLang >= 0.5.23 says which rank stores (HiCacheStorageConfig.is_storage_writer: MLA
        # has one writer per DCP shard); our keys follow the same rule, so the two must agree.
        writer = getattr(storage_config, "is_storage_writer", None)
        if isinstance(writer, bool) and writer != self._ident.is_writer:
            raise InvalidArgumentError(
                f"SGLang makes this rank a storage writer={writer}, the Fluxon key scheme "
                f"{self._ident.is_writer} (tp_rank={self._ident.tp_rank}, "
                f"dcp_rank={self._ident.dcp_rank}, mla={self._ident.is_mla})")

    def on_host_pools_registered(self) -> None:
        """SGLang's end of the registration burst (once per attach): the host pool must be
        registered by now; raising here fails the attach instead of every later call."""
        if self._store is None or self._keys is None:
            raise RuntimeError("Fluxon HiCache backend: on_host_pools_registered() before "
                               "register_mem_pool_host(): no host pool to serve")
        logger.info("fluxon: HiCache backend attached (%s, %d B/page, writer=%s)",
                    self._geom.layout, self._geom.page_bytes, self._ident.is_writer)

    def get_stats(self):
        s = FluxonHiCacheBackend.get_stats(self)
        if s is None or StorageMetrics is None:
            return s
        return StorageMetrics(prefetch_pgs=s.prefetch_pgs, backup_pgs=s.backup_pgs,
                              prefetch_bandwidth=s.prefetch_bandwidth,
                              backup_bandwidth=s.backup_bandwidth)
