"""Errors a user of the host library can act on."""

from __future__ import annotations


class SwitchMLError(RuntimeError):
    """Base class of the host library's runtime errors."""


class ControlPlaneError(SwitchMLError):
    """The controller refused a request or could not be reached (names the address)."""


class NoProgressError(SwitchMLError, TimeoutError):
    """An allreduce made no progress for the configured time: a peer died or
    stalled, or the switch is unreachable. ``chunk`` and ``slot`` name where."""

    def __init__(self, message: str, *, chunk: int = -1, slot: int = -1) -> None:
        super().__init__(message)
        self.chunk = chunk
        self.slot = slot
