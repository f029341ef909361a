"""Optional dependencies: is one installed, and which extra brings it.

A command that cannot do its job without an optional package checks for it
before it starts (not after minutes of measuring), and says in one line what to
install. The check looks the module up without importing it, so it costs
nothing on a command's start.
"""

from __future__ import annotations

import importlib.util

from .terminal import CLIError

#: import name -> (distribution name, the extra of switchml-emu that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "matplotlib": ("matplotlib", "bench"),
    "torch": ("torch", "torch"),
    "sklearn": ("scikit-learn", "torch"),
    "scapy": ("scapy", "capture"),
}


class MissingExtra(CLIError):
    """An optional package a command needs is not installed."""


def available(module: str) -> bool:
    """True when ``module`` can be found (it is not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_hint(module: str) -> str:
    """``pip install "switchml-emu[extra]"`` for ``module``."""
    _, extra = EXTRAS[module]
    return f'pip install "switchml-emu[{extra}]"'


def missing_message(module: str, purpose: str) -> str:
    """``<purpose> needs <package>: pip install "switchml-emu[<extra>]"``."""
    return f"{purpose} needs {EXTRAS[module][0]}: {install_hint(module)}"


def require(module: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` (one line, naming the extra) unless ``module``
    is installed; ``purpose`` says what needs it (``"plotting"``,
    ``"switchml cluster run"``)."""
    if not available(module):
        raise MissingExtra(missing_message(module, purpose))


def explain(exc: ImportError, purpose: str) -> str:
    """One line for an ImportError met while doing ``purpose``: which extra to
    install when the missing module is one of ours, else the error itself."""
    top = (exc.name or "").split(".")[0]
    return missing_message(top, purpose) if top in EXTRAS else f"{purpose}: {exc}"
