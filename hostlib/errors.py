"""Errors a user of the host library can act on.

:class:`SwitchMLError` and :class:`NoProgressError` are the worker protocol's
(:mod:`swemu.protocol.worker.errors`, which the switch's side shares).
"""

from __future__ import annotations

from swemu.protocol.worker.errors import NoProgressError, SwitchMLError

__all__ = ["ControlPlaneError", "NoProgressError", "SwitchMLError"]


class ControlPlaneError(SwitchMLError):
    """The controller refused a request or could not be reached (names the address)."""
