"""Fluxon's hostless data plane from Python.

The extension module ``_fluxon_kernels`` takes raw pointers and CUDA stream handles; nothing here
needs torch. When torch is importable, :class:`TorchKvCache` wraps a GPU KV pool given as tensors
(SGLang ``layer_first``: one ``[tokens, ...]`` buffer per layer for K and V, or one per layer for
MLA) and launches on the current stream.

Invariants:
- Every call validates before it launches and raises ``ValueError`` for caller mistakes (bad plan,
  wrong plan kind, null or misaligned pointers, out-of-range pages) and ``RuntimeError`` for CUDA
  failures; nothing is enqueued when it raises.
- Host memory (segment mappings, plan arena) must be registered with
  :func:`register_host_mappings` in the same CUDA context first; registration failure raises and is
  never silently skipped.
- Kernels run asynchronously on the given stream: values (write) or KV buffers (restore) are ready
  only after that stream reached the call; ``release_views``/``commit`` must wait for it.
"""

from __future__ import annotations

try:
    from . import _fluxon_kernels as _native  # packaged inside the fluxon wheel
except ImportError:  # pragma: no cover - a build tree or a packed folder on sys.path
    import _fluxon_kernels as _native  # type: ignore[no-redef]

KvLayout = _native.KvLayout
DataPlane = _native.DataPlane
LayerEvents = _native.LayerEvents
pages_from_slots = _native.pages_from_slots
HostRegistration = _native.HostRegistration
register_host_mappings = _native.register_host_mappings
PlanArena = _native.PlanArena

__all__ = [
    "KvLayout",
    "DataPlane",
    "LayerEvents",
    "pages_from_slots",
    "HostRegistration",
    "register_host_mappings",
    "PlanArena",
    "torch_available",
]

try:
    import torch as _torch
except ImportError:  # the wheel and the raw-pointer API work without torch
    _torch = None


def torch_available() -> bool:
    return _torch is not None


if _torch is not None:

    def _current_stream_handle(stream=None) -> int:
        s = stream if stream is not None else _torch.cuda.current_stream()
        return int(s.cuda_stream)

    def _row_bytes(buf) -> int:
        if not buf.is_cuda:
            raise ValueError("KV buffers must be CUDA tensors")
        if not buf.is_contiguous():
            raise ValueError("KV buffers must be contiguous ([tokens, ...] rows)")
        return buf[0].numel() * buf.element_size()

    class TorchKvCache:
        """A GPU KV pool of per-layer tensors, bound to Fluxon plans.

        k_buffers: per layer, the K buffer (MHA) or the compressed KV buffer (MLA), each shaped
        ``[device_pages * page_size, ...]``; v_buffers: per layer V buffers (MHA) or None (MLA).
        The tensors must outlive this object.
        """

        def __init__(self, k_buffers, v_buffers, page_size: int, plans=None, registration=None,
                     staging_group_pages: int = 0, staging_slots: int = 2):
            if len(k_buffers) == 0:
                raise ValueError("need at least one layer")
            attention = "mha" if v_buffers is not None else "mla"
            row_bytes = _row_bytes(k_buffers[0])
            tokens = k_buffers[0].shape[0]
            for b in list(k_buffers) + list(v_buffers or []):
                if _row_bytes(b) != row_bytes or b.shape[0] != tokens:
                    raise ValueError("all KV buffers must have the same shape and dtype size")
            if tokens % page_size != 0:
                raise ValueError(f"{tokens} tokens per buffer is not a multiple of page_size")
            self.layout = KvLayout(attention, len(k_buffers), page_size, row_bytes)
            self.device_pages = tokens // page_size
            self._buffers = (list(k_buffers), list(v_buffers or []))  # keep them alive
            self.plane = DataPlane(
                self.layout,
                [b.data_ptr() for b in k_buffers],
                [b.data_ptr() for b in (v_buffers or [])],
                self.device_pages,
                plans,
                registration,
                staging_group_pages,
                staging_slots,
            )

        @staticmethod
        def _indices(page_indices):
            if not isinstance(page_indices, _torch.Tensor) or not page_indices.is_cuda:
                raise ValueError("page_indices must be a CUDA tensor")
            if page_indices.dtype != _torch.int64:
                raise ValueError("page_indices must be int64")
            return page_indices.contiguous()

        def write(self, plan_ptr: int, page_indices, stream=None, **config) -> None:
            """Backup: all layers of each page -> the put plan's values."""
            idx = self._indices(page_indices)
            self.plane.write_pages(plan_ptr, idx.data_ptr(), idx.numel(),
                                   _current_stream_handle(stream), **config)

        def restore(self, plan_ptr: int, page_indices, layer_id=None, stream=None, **config) -> None:
            """Restore all layers (layer_id None) or one layer of each page from a get plan."""
            idx = self._indices(page_indices)
            self.plane.restore_pages(plan_ptr, idx.data_ptr(), idx.numel(),
                                     _current_stream_handle(stream), layer_id=layer_id, **config)

        def copy_engine(self, direction: str, plan_ptr: int, page_indices, layer_id=None,
                        stream=None, **options) -> None:
            """The same work on the copy engines (no SMs); indices are read on the host."""
            if isinstance(page_indices, _torch.Tensor):
                page_indices = page_indices.tolist()
            self.plane.copy_engine(direction, plan_ptr, list(page_indices),
                                   _current_stream_handle(stream), layer_id=layer_id, **options)

        def copy_staged(self, direction: str, plan_ptr: int, page_indices, layer_id=None,
                        stream=None, sm_budget: int = 8) -> None:
            """Copy engine through a device staging buffer plus a short gather/scatter kernel."""
            idx = self._indices(page_indices)
            self.plane.copy_staged(direction, plan_ptr, idx.data_ptr(), idx.tolist(),
                                   _current_stream_handle(stream), layer_id=layer_id,
                                   sm_budget=sm_budget)

        def take_device_errors(self) -> None:
            self.plane.take_device_errors()

    __all__.append("TorchKvCache")
