"""The errors the worker's protocol raises (hostlib re-exports them as its own)."""

from __future__ import annotations


class SwitchMLError(RuntimeError):
    """Base class of the host library's runtime errors."""


class NoProgressError(SwitchMLError, TimeoutError):
    """An allreduce made no progress for the configured time: a peer died or
    stalled, or the switch is unreachable. ``chunk`` and ``slot`` name where."""

    def __init__(self, message: str, *, chunk: int = -1, slot: int = -1) -> None:
        super().__init__(message)
        self.chunk = chunk
        self.slot = slot
