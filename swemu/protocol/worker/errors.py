"""The errors the worker's protocol raises.

Users meet them as the host library's (``hostlib.errors``, which re-exports them):
their ``__module__`` says so, so that a traceback's last line and ``repr`` name
the public place, ``hostlib.errors.NoProgressError``.
"""

from __future__ import annotations


class SwitchMLError(RuntimeError):
    """Base class of the host library's runtime errors."""

    __module__ = "hostlib.errors"


class NoProgressError(SwitchMLError, TimeoutError):
    """An allreduce made no progress for the configured time: a peer died or
    stalled, or the switch is unreachable. ``chunk`` and ``slot`` name where."""

    __module__ = "hostlib.errors"

    def __init__(self, message: str, *, chunk: int = -1, slot: int = -1) -> None:
        super().__init__(message)
        self.chunk = chunk
        self.slot = slot
