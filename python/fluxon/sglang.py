"""SGLang HiCache L3 storage backend backed by Fluxon.

Load it through SGLang's dynamic backend path::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "fluxon",
        "module_path": "fluxon.sglang", "class_name": "FluxonHiCacheStorage",
        "interface_v1": 1, "socket": "/tmp/fluxon/owner.sock", "namespace": "prod"}'

Everything it does is in `fluxon.hicache.FluxonHiCacheBackend` (torch-free, tested without
SGLang); this module only mixes that into SGLang's ``HiCacheStorage`` ABC and turns stats into
SGLang's ``StorageMetrics``. Importing it needs ``sglang`` (and therefore torch).
"""

from __future__ import annotations

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from fluxon.hicache import FluxonHiCacheBackend

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except Exception:  # older releases keep it elsewhere; plain stats objects work too
    StorageMetrics = None

__all__ = ["FluxonHiCacheStorage"]


class FluxonHiCacheStorage(FluxonHiCacheBackend, HiCacheStorage):
    """SGLang ``HiCacheStorage`` over a Fluxon owner (see FluxonHiCacheBackend for semantics)."""

    def __init__(self, storage_config, *args, **kwargs):
        FluxonHiCacheBackend.__init__(self, storage_config, *args, **kwargs)

    def get_stats(self):
        s = FluxonHiCacheBackend.get_stats(self)
        if s is None or StorageMetrics is None:
            return s
        return StorageMetrics(prefetch_pgs=s.prefetch_pgs, backup_pgs=s.backup_pgs,
                              prefetch_bandwidth=s.prefetch_bandwidth,
                              backup_bandwidth=s.backup_bandwidth)
