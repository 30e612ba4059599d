"""Exceptions raised by the fluxon client."""

from __future__ import annotations

import builtins
from typing import Sequence

# absl::StatusCode values used on the wire.
_INVALID_ARGUMENT = 3
_DEADLINE_EXCEEDED = 4
_NOT_FOUND = 5
_ALREADY_EXISTS = 6
_PERMISSION_DENIED = 7
_RESOURCE_EXHAUSTED = 8
_FAILED_PRECONDITION = 9
_ABORTED = 10
_UNAVAILABLE = 14


class FluxonError(Exception):
    """Base class of every error the fluxon client raises."""

    code: int = 2  # UNKNOWN

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgumentError(FluxonError, ValueError):
    """A call was given bad input; nothing was reserved."""

    code = _INVALID_ARGUMENT


class KeyConflictError(FluxonError):
    """Some keys are already stored or being written; nothing was reserved.

    ``conflict_indices`` lists the positions (in the call's ``keys``) that conflicted.
    """

    code = _ALREADY_EXISTS

    def __init__(self, message: str, conflict_indices: Sequence[int] = ()):
        super().__init__(message)
        self.conflict_indices = list(conflict_indices)


class NoSpaceError(FluxonError):
    """The owner could not find room for the values within the bounded claim wait."""

    code = _RESOURCE_EXHAUSTED


class TimeoutError(FluxonError, builtins.TimeoutError):  # noqa: A001 - mirrors the builtin
    """A wait ran out of time (also a builtin ``TimeoutError``)."""

    code = _DEADLINE_EXCEEDED


class NotFoundError(FluxonError, LookupError):
    """An unknown, expired or already-consumed plan or handle."""

    code = _NOT_FOUND


class PlanStateError(FluxonError):
    """A plan or handle used in the wrong state (e.g. consumed twice)."""

    code = _FAILED_PRECONDITION


class FetchFailedError(FluxonError):
    """A deferred get's consumed values could not all be fetched from the owners holding them;
    the handle was released (start the get again: what did arrive is held locally now). Raised
    by get_transfer only: Aborted elsewhere (a write-through put) means something else."""

    code = _ABORTED


class OwnerUnavailableError(FluxonError, ConnectionError):
    """The owner daemon cannot be reached (is fluxond running?)."""

    code = _UNAVAILABLE


_BY_CODE = {
    _INVALID_ARGUMENT: InvalidArgumentError,
    _DEADLINE_EXCEEDED: TimeoutError,
    _NOT_FOUND: NotFoundError,
    _RESOURCE_EXHAUSTED: NoSpaceError,
    _FAILED_PRECONDITION: PlanStateError,
    _UNAVAILABLE: OwnerUnavailableError,
}


def from_status(code: int, message: str, conflict_indices: Sequence[int] = ()) -> FluxonError:
    """Maps a status (code, message) to the matching exception instance."""
    if code == _ALREADY_EXISTS:
        return KeyConflictError(message, conflict_indices)
    cls = _BY_CODE.get(code, FluxonError)
    err = cls(message)
    err.code = code
    return err
