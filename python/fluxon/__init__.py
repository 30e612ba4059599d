"""Fluxon client: the hostless KV-cache API an inference process uses.

    client = fluxon.KvClient()                       # attaches to the local owner's segment
    plan = client.local_fast_put_start(keys, value_len)
    ...  # a kernel writes each page to the addresses in the plan blob
    fut = client.local_fast_put_commit(plan)         # locally readable at once; fut: route published
    h = client.get_start(keys)                       # plan a prefix restore
    plan = client.get_transfer(h)                    # readable plan over h.result.transferable_len
    ...  # a kernel restores from the plan's addresses
    client.release_views(plan)

Every argument is validated here and again in the native layer before anything is reserved.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

from . import _native
from .errors import (
    FluxonError,
    InvalidArgumentError,
    KeyConflictError,
    NoSpaceError,
    NotFoundError,
    OwnerUnavailableError,
    PlanStateError,
    TimeoutError,
    from_status,
)

__version__ = _native.__version__
PLAN_BLOB_MAGIC = _native.PLAN_BLOB_MAGIC
DEFAULT_SOCKET_PATH = "/tmp/fluxon/owner.sock"
MAX_VALUE_LEN = 512 * 1024 * 1024

__all__ = [
    "KvClient",
    "KvFuture",
    "PutOptionalArgs",
    "GetStartHandle",
    "GetStartResult",
    "FluxonError",
    "InvalidArgumentError",
    "KeyConflictError",
    "NoSpaceError",
    "NotFoundError",
    "OwnerUnavailableError",
    "PlanStateError",
    "TimeoutError",
    "copy_to_plan",
    "copy_from_plan",
    "copy_segments_to_plan",
    "copy_segments_from_plan",
    "plan_value_ptrs",
]


def _raise_native(e: "_native.Error") -> None:
    code, message, indices = e.args
    raise from_status(code, message, indices) from None


def _call(fn, *args):
    try:
        return fn(*args)
    except _native.Error as e:
        _raise_native(e)


# ----------------------------------------------------------------------------------------------
# Validation (the native layer repeats it before any reservation or RPC).


def _check_keys(keys) -> list:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise InvalidArgumentError("keys must be a list of str")
    keys = list(keys)
    if not keys:
        raise InvalidArgumentError("keys must not be empty")
    seen = set()
    for i, k in enumerate(keys):
        if not isinstance(k, str):
            raise InvalidArgumentError(f"keys[{i}] must be str, got {type(k).__name__}")
        if not k:
            raise InvalidArgumentError(f"keys[{i}] is an empty string")
        if k in seen:
            raise InvalidArgumentError(f"keys[{i}] ({k!r}) appears twice in one batch")
        seen.add(k)
    return keys


def _check_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgumentError(f"{name} must be an int, got {type(v).__name__}")
    return v


def _check_groups(groups, n: int) -> list:
    if groups is None:
        return []
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise InvalidArgumentError("atomic_group_lens must be a list of int")
    out = []
    for i, g in enumerate(groups):
        g = _check_int(f"atomic_group_lens[{i}]", g)
        if g <= 0:
            raise InvalidArgumentError(f"atomic_group_lens[{i}] must be positive, got {g}")
        out.append(g)
    if sum(out) != n:
        raise InvalidArgumentError(f"atomic_group_lens sum to {sum(out)} but there are {n} keys")
    return out


def _check_mask(mask, groups: list, n: int) -> list:
    if mask is None:
        return []
    if isinstance(mask, (str, bytes)) or not isinstance(mask, Sequence):
        raise InvalidArgumentError("make_replica_task_mask must be a list of bool")
    mask = list(mask)
    if len(mask) != n:
        raise InvalidArgumentError(
            f"make_replica_task_mask has {len(mask)} entries but there are {n} keys")
    for i, b in enumerate(mask):
        if not isinstance(b, bool):
            raise InvalidArgumentError(f"make_replica_task_mask[{i}] must be bool")
    start = 0
    for gi, g in enumerate(groups):
        if len(set(mask[start:start + g])) > 1:
            raise InvalidArgumentError(
                f"make_replica_task_mask mixes values inside atomic group {gi}")
        start += g
    return mask


@dataclass
class PutOptionalArgs:
    """Options of local_fast_put_start (SGLang always keeps both reject flags on)."""

    reject_if_inflight_same_key: bool = True
    reject_if_exist_same_key: bool = True
    write_through: bool = False
    make_replica_task: bool = False
    make_replica_task_mask: Optional[list] = None
    atomic_group_lens: Optional[list] = None
    lease_id: Optional[str] = None
    # The key of the page just before keys[0] in its prompt: eviction keeps the chain together
    # and takes it from its tail. A hint only; None: unknown.
    parent_key: Optional[str] = None


@dataclass(frozen=True)
class GetStartResult:
    raw_prefix_hit_len: int
    transferable_len: int
    prefix_hit_groups: int
    first_miss_index: Optional[int]
    first_miss_group_index: Optional[int]
    all_hit: bool
    local_pinned: int = 0
    inflight_joined: int = 0
    leader_started: int = 0


class GetStartHandle:
    """What get_start returns: consume it once with get_transfer or cancel_get_transfer."""

    __slots__ = ("_native", "result", "_client")

    def __init__(self, native_handle, client: "KvClient"):
        self._native = native_handle
        self._client = client
        self.result = GetStartResult(**native_handle.result())

    def __repr__(self) -> str:
        return f"GetStartHandle({self.result})"


class KvFuture:
    """Completes when the committed batch's route is published by the master."""

    __slots__ = ("_native", "_exc", "_done")

    def __init__(self, native_future):
        self._native = native_future
        self._exc: Optional[FluxonError] = None
        self._done = False

    def done(self) -> bool:
        if not self._done and self._native.done():
            self._settle(0.0)
        return self._done

    def _settle(self, timeout: Optional[float]) -> bool:
        code, message = self._native.wait(timeout)
        if code == 4 and not self._native.done():  # the wait itself timed out
            return False
        self._done = True
        if code != 0:
            self._exc = from_status(code, message)
        return True

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for publish; raises the failure, or fluxon.TimeoutError if not done in time."""
        if timeout is not None and timeout < 0:
            raise InvalidArgumentError("timeout must be >= 0")
        if not self._done and not self._settle(timeout):
            raise TimeoutError(f"put not published within {timeout} s")
        if self._exc is not None:
            raise self._exc

    def exception(self) -> Optional[FluxonError]:
        """The failure once done (None while pending or on success)."""
        self.done()
        return self._exc


class KvClient:
    """A connection to the machine's Fluxon owner (thread-safe)."""

    def __init__(self, socket_path: Optional[str] = None, config_path: Optional[str] = None):
        if socket_path is not None and not isinstance(socket_path, str):
            raise InvalidArgumentError("socket_path must be a str")
        if socket_path is None and config_path is not None:
            socket_path = _call(_native.socket_from_config, str(config_path))
        if socket_path is None:
            socket_path = os.environ.get("FLUXON_SOCKET", DEFAULT_SOCKET_PATH)
        self.socket_path = socket_path
        self._c = _call(_native.Client, socket_path)

    def wait_local_segments_ready(self) -> list:
        """Mappings to register with CUDA: segment_label, write_ptr, read_ptr, len, generation,
        node_id."""
        return self._c.segments()

    def prefault_segment(self) -> None:
        """Maps every segment page into this process now, so CPU copies into values take no
        first-touch faults (CUDA registration does this too). With a dynamic-capacity owner this
        allocates the whole segment."""
        _call(self._c.prefault_segment)

    def plan_arena(self) -> tuple:
        """(address, length) of the plan-blob arena, for CUDA registration."""
        return self._c.plan_arena()

    def local_fast_put_start(self, keys, value_len, opts: Optional[PutOptionalArgs] = None) -> int:
        keys = _check_keys(keys)
        value_len = _check_int("value_len", value_len)
        if value_len <= 0:
            raise InvalidArgumentError(f"value_len must be > 0, got {value_len}")
        if value_len > MAX_VALUE_LEN:
            raise InvalidArgumentError(f"value_len {value_len} exceeds the 512 MiB value limit")
        if opts is None:
            opts = PutOptionalArgs()
        elif not isinstance(opts, PutOptionalArgs):
            raise InvalidArgumentError("opts must be a fluxon.PutOptionalArgs")
        groups = _check_groups(opts.atomic_group_lens, len(keys))
        mask = _check_mask(opts.make_replica_task_mask, groups, len(keys))
        if opts.lease_id is not None and not isinstance(opts.lease_id, str):
            raise InvalidArgumentError("lease_id must be a str or None")
        if opts.parent_key is not None and (not isinstance(opts.parent_key, str)
                                            or opts.parent_key in keys):
            raise InvalidArgumentError(
                "parent_key must be a str that is not one of the batch's keys, or None")
        return _call(self._c.put_start, keys, value_len, bool(opts.reject_if_inflight_same_key),
                     bool(opts.reject_if_exist_same_key), bool(opts.write_through),
                     bool(opts.make_replica_task), mask, groups, opts.lease_id or "",
                     opts.parent_key or "")

    def local_fast_put_commit(self, plan_ptr: int) -> KvFuture:
        return KvFuture(_call(self._c.put_commit, _check_int("plan_ptr", plan_ptr)))

    def put_abort(self, plan_ptr: int) -> None:
        _call(self._c.put_abort, _check_int("plan_ptr", plan_ptr))

    def get_start(self, keys, prefix_best_effort: bool = True,
                  atomic_group_lens=None) -> GetStartHandle:
        keys = _check_keys(keys)
        groups = _check_groups(atomic_group_lens, len(keys))
        h = _call(self._c.get_start, keys, bool(prefix_best_effort), groups)
        return GetStartHandle(h, self)

    def get_transfer(self, handle: GetStartHandle, *, consume_prefix_len=None) -> int:
        if not isinstance(handle, GetStartHandle) or handle._client is not self:
            raise InvalidArgumentError("handle must be a GetStartHandle from this client's get_start")
        if consume_prefix_len is not None:
            consume_prefix_len = _check_int("consume_prefix_len", consume_prefix_len)
            t = handle.result.transferable_len
            if consume_prefix_len <= 0 or consume_prefix_len > t:
                raise InvalidArgumentError(
                    f"consume_prefix_len must be in [1, transferable_len={t}], "
                    f"got {consume_prefix_len}")
        return _call(self._c.get_transfer, handle._native, consume_prefix_len)

    def cancel_get_transfer(self, handle: GetStartHandle) -> None:
        if not isinstance(handle, GetStartHandle) or handle._client is not self:
            raise InvalidArgumentError("handle must be a GetStartHandle from this client's get_start")
        _call(self._c.cancel_get_transfer, handle._native)

    def release_views(self, plan_ptr: int) -> None:
        _call(self._c.release_views, _check_int("plan_ptr", plan_ptr))

    def stats(self) -> dict:
        return dict(_call(self._c.stats))

    def delete_prefix(self, prefix: str) -> Tuple[int, int]:
        """Deletes the owner's committed values whose key starts with `prefix` (non-empty);
        values being read or written stay. Returns (deleted, skipped_in_use)."""
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgumentError("prefix must be a non-empty str")
        return tuple(_call(self._c.delete_prefix, prefix))


def plan_value_ptrs(plan_ptr: int) -> list:
    """The value addresses of a live plan (what a kernel reads from the blob)."""
    return _call(_native.plan_value_ptrs, _check_int("plan_ptr", plan_ptr))


def copy_to_plan(plan_ptr: int, host_ptr: int, value_len: int, threads: int = 4) -> None:
    """Copies len(plan) contiguous values from host memory into the plan's values (no GIL)."""
    _call(_native.copy_plan, plan_ptr, host_ptr, value_len, True, threads)


def copy_from_plan(plan_ptr: int, host_ptr: int, value_len: int, threads: int = 4) -> None:
    """Copies the plan's values into contiguous host memory (no GIL)."""
    _call(_native.copy_plan, plan_ptr, host_ptr, value_len, False, threads)


def copy_segments_to_plan(plan_ptr: int, seg_ptrs, seg_sizes, segs_per_value: int,
                          value_len: int, threads: int = 4) -> None:
    """Gathers host segments into the plan's first len(seg_ptrs)//segs_per_value values (no GIL).

    Value i is the concatenation of segments [i*segs_per_value, (i+1)*segs_per_value); each
    value's segments must add up to exactly value_len bytes.
    """
    n = _segment_value_count(seg_ptrs, seg_sizes, segs_per_value)
    _call(_native.copy_segments, _check_int("plan_ptr", plan_ptr), n,
          _check_int("value_len", value_len), seg_ptrs, seg_sizes, segs_per_value, True, threads)


def copy_segments_from_plan(plan_ptr: int, seg_ptrs, seg_sizes, segs_per_value: int,
                            value_len: int, threads: int = 4) -> None:
    """Scatters the plan's first len(seg_ptrs)//segs_per_value values into host segments (no GIL)."""
    n = _segment_value_count(seg_ptrs, seg_sizes, segs_per_value)
    _call(_native.copy_segments, _check_int("plan_ptr", plan_ptr), n,
          _check_int("value_len", value_len), seg_ptrs, seg_sizes, segs_per_value, False, threads)


def _segment_value_count(seg_ptrs, seg_sizes, segs_per_value) -> int:
    spv = _check_int("segs_per_value", segs_per_value)
    if spv <= 0:
        raise InvalidArgumentError(f"segs_per_value must be > 0, got {spv}")
    if len(seg_ptrs) != len(seg_sizes):
        raise InvalidArgumentError(
            f"{len(seg_ptrs)} segment pointers but {len(seg_sizes)} segment sizes")
    if len(seg_ptrs) % spv:
        raise InvalidArgumentError(
            f"{len(seg_ptrs)} segments is not a multiple of segs_per_value={spv}")
    return len(seg_ptrs) // spv
