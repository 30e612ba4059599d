"""Fluxon client: the hostless KV-cache API an inference process uses.

    client = fluxon.KvClient()                       # attaches to the local owner's segment
    plan = client.local_fast_put_start(keys, value_len)
    ...  # a kernel writes each page to the addresses in the plan blob
    fut = client.local_fast_put_commit(plan)         # locally readable at once; fut: route published
    h = client.get_start(keys)                       # plan a prefix restore
    plan = client.get_transfer(h)                    # readable plan over h.result.transferable_len
    ...  # a kernel restores from the plan's addresses
    client.release_views(plan)

Every argument is validated here and again in the native layer before anything is reserved:
a bad one raises fluxon.InvalidArgumentError (never a raw TypeError or OverflowError). A plan
pointer is looked up in the plan registry of the live client that issued it before anything reads
it, so a forged or stale integer fails cleanly instead of crashing the process.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from . import _native
from .errors import (
    FetchFailedError,
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
MAX_VALUE_LEN = _native.MAX_VALUE_BYTES  # 512 MiB
MAX_KEY_BYTES = _native.MAX_KEY_BYTES  # bytes of UTF-8 per key (also parent_key, delete prefix)
MAX_BATCH_KEYS = _native.MAX_BATCH_KEYS  # keys per batch
MAX_COPY_THREADS = 1024
_U64_MAX = 2**64 - 1

__all__ = [
    "KvClient",
    "KvFuture",
    "PutOptionalArgs",
    "GetStartHandle",
    "GetStartResult",
    "FetchFailedError",
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
    "MAX_KEY_BYTES",
    "MAX_BATCH_KEYS",
    "MAX_VALUE_LEN",
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


def _check_sequence(name: str, v) -> None:
    """A list, tuple or other sized, indexable container (e.g. a numpy array); not str/bytes."""
    if isinstance(v, (str, bytes)) or not (
            isinstance(v, Sequence) or (hasattr(v, "__len__") and hasattr(v, "__getitem__"))):
        raise InvalidArgumentError(f"{name} must be a list, got {type(v).__name__}")


def _check_str(name: str, v, max_bytes: Optional[int] = None) -> str:
    """A non-empty str that encodes to UTF-8 (no lone surrogates) within max_bytes."""
    if not isinstance(v, str):
        raise InvalidArgumentError(f"{name} must be str, got {type(v).__name__}")
    if not v:
        raise InvalidArgumentError(f"{name} is an empty string")
    if v.isascii():
        n = len(v)
    else:
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise InvalidArgumentError(
                f"{name} is not valid UTF-8 text ({e.reason} at character {e.start})") from None
    if max_bytes is not None and n > max_bytes:
        raise InvalidArgumentError(f"{name} is {n} bytes of UTF-8; the limit is {max_bytes}")
    return v


def _check_optional_str(name: str, v, max_bytes: Optional[int] = None) -> Optional[str]:
    """None or "" (unset) becomes None; anything else must pass _check_str."""
    return None if v is None or v == "" else _check_str(name, v, max_bytes)


def _check_keys(keys) -> list:
    _check_sequence("keys", keys)
    keys = list(keys)
    if not keys:
        raise InvalidArgumentError("keys must not be empty")
    if len(keys) > MAX_BATCH_KEYS:
        raise InvalidArgumentError(
            f"a batch holds at most {MAX_BATCH_KEYS} keys, got {len(keys)}")
    seen = set()
    for i, k in enumerate(keys):
        _check_str(f"keys[{i}]", k, MAX_KEY_BYTES)
        if k in seen:
            raise InvalidArgumentError(f"keys[{i}] ({k!r}) appears twice in one batch")
        seen.add(k)
    return keys


def _check_int(name: str, v, lo: int = -(2**63), hi: int = 2**63 - 1) -> int:
    """An int (or anything with __index__, e.g. a numpy integer; not bool) in [lo, hi]."""
    if isinstance(v, bool):
        raise InvalidArgumentError(f"{name} must be an int, got bool")
    try:
        v = operator.index(v)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an int, got {type(v).__name__}") from None
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def _check_ptr(name: str, v) -> int:
    """A non-null address (a 64-bit unsigned integer)."""
    return _check_int(name, v, 1, _U64_MAX)


def _check_value_len(v) -> int:
    return _check_int("value_len", v, 1, MAX_VALUE_LEN)


def _check_threads(v) -> int:
    return _check_int("threads", v, 1, MAX_COPY_THREADS)


def _check_bool(name: str, v) -> bool:
    """A bool (ints 0 and 1 are accepted too)."""
    if not isinstance(v, bool):
        try:
            v = operator.index(v)
        except TypeError:
            v = None
        if v not in (0, 1):
            raise InvalidArgumentError(f"{name} must be a bool")
    return bool(v)


def _check_groups(groups, n: int) -> list:
    if groups is None:
        return []
    _check_sequence("atomic_group_lens", groups)
    out = [_check_int(f"atomic_group_lens[{i}]", g, 1, MAX_BATCH_KEYS)
           for i, g in enumerate(groups)]
    if sum(out) != n:
        raise InvalidArgumentError(f"atomic_group_lens sum to {sum(out)} but there are {n} keys")
    return out


def _check_supported(reject_inflight, reject_exist, write_through, lease_id):
    """Options the API names but Fluxon does not implement yet are refused, never ignored (the
    same rule as the C++ client's and the owner's ValidateSupportedPutOptions)."""
    if not reject_inflight:
        raise InvalidArgumentError(
            "reject_if_inflight_same_key=False is not supported: a key being written or fetched "
            "is always rejected (KeyConflictError)")
    if not reject_exist:
        raise InvalidArgumentError(
            "reject_if_exist_same_key=False is not supported: a stored key is always rejected "
            "(values are immutable; delete it first)")
    # write_through=True: the owner decides (a cluster owner copies every group to another node
    # before the put completes; an owner with no other node refuses it).
    if lease_id:
        raise InvalidArgumentError(
            "lease_id is not implemented (no lease semantics yet); leave it unset")


def _check_mask(mask, groups: list, n: int) -> list:
    if mask is None:
        return []
    _check_sequence("make_replica_task_mask", mask)
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
    """Options of local_fast_put_start. In effect: atomic_group_lens, parent_key,
    make_replica_task and make_replica_task_mask (after the local commit the owner asks the
    master for a target per atomic group and the target pulls a copy, off the put's path; a key
    is replicated when make_replica_task and its mask entry, default True, are both set; the
    mask is uniform inside each atomic group), and write_through (the commit's future completes
    only once every value has a routed copy on another node; a cluster owner only, an owner with
    no other node refuses it). The reject flags are always on (False is refused); a lease_id is
    refused (InvalidArgumentError naming the option) until leases are implemented — never
    accepted and ignored."""

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
    # allow_deferred: values of the prefix were still being fetched from other owners when the
    # owner answered; get_transfer waits for them and raises FetchFailedError if one could not be
    # fetched (the handle is then released).
    deferred: bool = False
    # get_start(transfer=True): the owner transferred the whole prefix with its answer.
    transferred: bool = False


class GetStartHandle:
    """What get_start returns: consume it once with get_transfer or cancel_get_transfer."""

    __slots__ = ("_native", "result", "_client")

    def __init__(self, native_handle, client: "KvClient"):
        self._native = native_handle
        self._client = client
        self.result = GetStartResult(**native_handle.result())

    def __repr__(self) -> str:
        return f"GetStartHandle({self.result})"


_MAX_TIMEOUT_S = 2**31  # longer waits are waits forever (the native wait counts ms in int64)


def _check_timeout(timeout) -> Optional[float]:
    """None (forever) or a number of seconds >= 0; inf and very long waits become None."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidArgumentError(
            f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
    timeout = float(timeout)
    if math.isnan(timeout) or timeout < 0:
        raise InvalidArgumentError(f"timeout must be >= 0, got {timeout}")
    return None if timeout >= _MAX_TIMEOUT_S else timeout


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
        timeout = _check_timeout(timeout)
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
        """Attaches to the owner at socket_path (else the config's, else $FLUXON_SOCKET, else
        the default). Every call waits at most the call timeout for the owner, then raises
        fluxon.TimeoutError: the config's client.call_timeout_ms, else $FLUXON_CALL_TIMEOUT_MS,
        else 60 s."""
        if socket_path is not None:
            _check_str("socket_path", socket_path)
        call_timeout_ms = None
        if config_path is not None:
            if not isinstance(config_path, (str, os.PathLike)):
                raise InvalidArgumentError("config_path must be a str or os.PathLike")
            config_path = _check_str("config_path", os.fsdecode(config_path))
            if socket_path is None:
                socket_path = _call(_native.socket_from_config, config_path)
            if call_timeout_ms is None:
                call_timeout_ms = _call(_native.call_timeout_ms_from_config, config_path)
        if socket_path is None:
            socket_path = _check_str("FLUXON_SOCKET",
                                     os.environ.get("FLUXON_SOCKET", DEFAULT_SOCKET_PATH))
        self.socket_path = socket_path
        if call_timeout_ms is None and os.environ.get("FLUXON_CALL_TIMEOUT_MS"):
            text = os.environ["FLUXON_CALL_TIMEOUT_MS"]
            if not text.isdigit() or not 0 < int(text) <= 86_400_000:
                raise InvalidArgumentError(
                    f"FLUXON_CALL_TIMEOUT_MS must be an integer in (0, 86400000], got {text!r}")
            call_timeout_ms = int(text)
        if call_timeout_ms is None:
            self._c = _call(_native.Client, socket_path)
        else:
            self._c = _call(_native.Client, socket_path, call_timeout_ms)
        self._arena = tuple(self._c.plan_arena())  # (base, bytes): fixed for the client's life
        with _live_clients_lock:
            _live_clients.add(self)

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
        value_len = _check_value_len(value_len)
        if opts is None:
            opts = PutOptionalArgs()
        elif not isinstance(opts, PutOptionalArgs):
            raise InvalidArgumentError("opts must be a fluxon.PutOptionalArgs")
        groups = _check_groups(opts.atomic_group_lens, len(keys))
        mask = _check_mask(opts.make_replica_task_mask, groups, len(keys))
        lease_id = _check_optional_str("lease_id", opts.lease_id)
        parent_key = _check_optional_str("parent_key", opts.parent_key, MAX_KEY_BYTES)
        if parent_key is not None and parent_key in keys:
            raise InvalidArgumentError(
                f"parent_key is keys[{keys.index(parent_key)}] of the same batch; it must name "
                "the page before keys[0]")
        flags = [_check_bool(name, getattr(opts, name)) for name in (
            "reject_if_inflight_same_key", "reject_if_exist_same_key", "write_through",
            "make_replica_task")]
        _check_supported(*flags[:3], lease_id)
        return _call(self._c.put_start, keys, value_len, *flags, mask, groups, lease_id or "",
                     parent_key)

    def local_fast_put_commit(self, plan_ptr: int) -> KvFuture:
        return KvFuture(_call(self._c.put_commit, _check_ptr("plan_ptr", plan_ptr)))

    def put_abort(self, plan_ptr: int) -> None:
        _call(self._c.put_abort, _check_ptr("plan_ptr", plan_ptr))

    def get_start(self, keys, prefix_best_effort: bool = True,
                  atomic_group_lens=None, *, allow_deferred: bool = False,
                  transfer: bool = False) -> GetStartHandle:
        """With allow_deferred the owner may answer before it has fetched the values other
        owners hold (result.deferred): the fetch overlaps whatever the caller does next, and
        get_transfer waits only for the consumed prefix.

        With transfer the owner also transfers the whole transferable prefix in the same round
        trip (unless it deferred the answer; result.transferred says): get_transfer then returns
        the plan without calling the owner, the views' lease starts now, a shorter
        consume_prefix_len keeps the rest's views until release_views, and cancel_get_transfer
        releases the views. For restores that consume what they found: one round trip fewer. A
        get_transfer after the views' lease (the owner's view_lease_ms from get_start) raises
        TimeoutError."""
        keys = _check_keys(keys)
        groups = _check_groups(atomic_group_lens, len(keys))
        h = _call(self._c.get_start, keys, _check_bool("prefix_best_effort", prefix_best_effort),
                  groups, _check_bool("allow_deferred", allow_deferred),
                  _check_bool("transfer", transfer))
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
        try:
            return _call(self._c.get_transfer, handle._native, consume_prefix_len)
        except FluxonError as e:
            if e.code == FetchFailedError.code:  # only a deferred handle's transfer aborts
                raise FetchFailedError(str(e)) from None
            raise

    def cancel_get_transfer(self, handle: GetStartHandle) -> None:
        if not isinstance(handle, GetStartHandle) or handle._client is not self:
            raise InvalidArgumentError("handle must be a GetStartHandle from this client's get_start")
        _call(self._c.cancel_get_transfer, handle._native)

    def release_views(self, plan_ptr: int) -> None:
        _call(self._c.release_views, _check_ptr("plan_ptr", plan_ptr))

    def stats(self) -> dict:
        return dict(_call(self._c.stats))

    def delete_prefix(self, prefix: str) -> Tuple[int, int]:
        """Deletes the owner's committed values whose key starts with `prefix` (non-empty);
        values being read or written stay. Returns (deleted, skipped_in_use)."""
        return tuple(_call(self._c.delete_prefix, _check_str("prefix", prefix, MAX_KEY_BYTES)))


# ----------------------------------------------------------------------------------------------
# Plan access. A plan pointer is only meaningful to the client that issued it: the functions below
# find that client by its plan arena and let its registry validate the pointer (NotFoundError for
# an address it never issued, PlanStateError once consumed) before anything reads the blob.

_live_clients: "weakref.WeakSet[KvClient]" = weakref.WeakSet()
_live_clients_lock = threading.Lock()


def _client_of_plan(plan_ptr) -> Tuple[int, "KvClient"]:
    plan_ptr = _check_ptr("plan_ptr", plan_ptr)
    with _live_clients_lock:
        clients = list(_live_clients)
    for c in clients:
        base, size = c._arena
        if base <= plan_ptr < base + size:
            return plan_ptr, c
    raise InvalidArgumentError(
        f"plan_ptr {plan_ptr:#x} is not a plan of any live fluxon client in this process")


def plan_value_ptrs(plan_ptr: int) -> list:
    """The value addresses of a live plan (what a kernel reads from the blob)."""
    plan_ptr, c = _client_of_plan(plan_ptr)
    return _call(c._c.plan_value_ptrs, plan_ptr)


def _copy_plan(plan_ptr, host_ptr, value_len, threads, to_values: bool) -> None:
    plan_ptr, c = _client_of_plan(plan_ptr)
    _call(c._c.copy_plan, plan_ptr, _check_ptr("host_ptr", host_ptr), _check_value_len(value_len),
          to_values, _check_threads(threads))


def copy_to_plan(plan_ptr: int, host_ptr: int, value_len: int, threads: int = 4) -> None:
    """Copies len(plan) contiguous values from host memory into the plan's values (no GIL)."""
    _copy_plan(plan_ptr, host_ptr, value_len, threads, True)


def copy_from_plan(plan_ptr: int, host_ptr: int, value_len: int, threads: int = 4) -> None:
    """Copies the plan's values into contiguous host memory (no GIL)."""
    _copy_plan(plan_ptr, host_ptr, value_len, threads, False)


def _copy_segments(plan_ptr, seg_ptrs, seg_sizes, segs_per_value, value_len, threads,
                   to_values: bool) -> None:
    plan_ptr, c = _client_of_plan(plan_ptr)
    n, spv = _segment_value_count(seg_ptrs, seg_sizes, segs_per_value)
    # The native layer converts the segment lists itself (every item checked, index named).
    _call(c._c.copy_segments, plan_ptr, n, _check_value_len(value_len), seg_ptrs, seg_sizes,
          spv, to_values, _check_threads(threads))


def copy_segments_to_plan(plan_ptr: int, seg_ptrs, seg_sizes, segs_per_value: int,
                          value_len: int, threads: int = 4) -> None:
    """Gathers host segments into the plan's first len(seg_ptrs)//segs_per_value values (no GIL).

    Value i is the concatenation of segments [i*segs_per_value, (i+1)*segs_per_value); each
    value's segments must add up to exactly value_len bytes.
    """
    _copy_segments(plan_ptr, seg_ptrs, seg_sizes, segs_per_value, value_len, threads, True)


def copy_segments_from_plan(plan_ptr: int, seg_ptrs, seg_sizes, segs_per_value: int,
                            value_len: int, threads: int = 4) -> None:
    """Scatters the plan's first len(seg_ptrs)//segs_per_value values into host segments (no GIL)."""
    _copy_segments(plan_ptr, seg_ptrs, seg_sizes, segs_per_value, value_len, threads, False)


def _segment_value_count(seg_ptrs, seg_sizes, segs_per_value) -> Tuple[int, int]:
    """(values, segs_per_value) of a segment copy, checked."""
    spv = _check_int("segs_per_value", segs_per_value, 1, _U64_MAX)
    _check_sequence("seg_ptrs", seg_ptrs)
    _check_sequence("seg_sizes", seg_sizes)
    if len(seg_ptrs) != len(seg_sizes):
        raise InvalidArgumentError(
            f"{len(seg_ptrs)} segment pointers but {len(seg_sizes)} segment sizes")
    if len(seg_ptrs) % spv:
        raise InvalidArgumentError(
            f"{len(seg_ptrs)} segments is not a multiple of segs_per_value={spv}")
    return len(seg_ptrs) // spv, spv
