"""Optional dependencies, as the CLI reports them: :mod:`swemu.options` with a
one-line :class:`~cli.terminal.CLIError` for a missing one.

A command that cannot do its job without an optional package checks for it
before it starts (not after minutes of measuring), and says in one line what to
install.
"""

from __future__ import annotations

from swemu import options
from swemu.options import EXTRAS, available, explain, install_hint, missing_message

from .terminal import CLIError

__all__ = [
    "EXTRAS",
    "MissingExtra",
    "available",
    "explain",
    "install_hint",
    "missing_message",
    "require",
]


class MissingExtra(CLIError):
    """An optional package a command needs is not installed."""


def require(module: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` (one line, naming the extra) unless ``module``
    is installed; ``purpose`` says what needs it (``"plotting"``,
    ``"switchml cluster run"``)."""
    try:
        options.require(module, purpose)
    except options.MissingExtra as exc:
        raise MissingExtra(str(exc)) from None
