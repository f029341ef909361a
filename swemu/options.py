"""What the commands share below any command-line parser: sizes written as text
and the optional dependencies.

``switchml``/``switchml-emu`` (click), ``python -m bench`` (argparse) and the
products' plots all read ``16Mi``-style sizes and check for an optional package
before a long run; this module does both with plain exceptions, and each parser
turns them into its own one-line error (:mod:`cli.terminal`, :mod:`cli.extras`).
Looking a module up does not import it, so a check costs nothing at start.

May import: nothing of the project.
"""

from __future__ import annotations

import importlib.util

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "b": 1,
}


def parse_size(text: str) -> int:
    """``16Mi``, ``1MiB``, ``4k``, ``1000000`` -> an integer (binary or decimal
    suffixes); :class:`ValueError` with a message for anything else."""
    t = text.strip().replace("_", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = t[len(num) :].lower()
    bad = f"{text!r} is not a size (examples: 1000, 16Mi, 64MiB)"
    if unit not in _UNITS or not num:
        raise ValueError(bad)
    try:
        value = float(num) * _UNITS[unit]
    except ValueError:
        raise ValueError(bad) from None
    if value < 0 or value != int(value):
        raise ValueError(f"{text!r} must be a whole, non-negative number")
    return int(value)


#: import name -> (distribution name, the extra of switchml-emu that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "matplotlib": ("matplotlib", "bench"),
    "torch": ("torch", "torch"),
    "sklearn": ("scikit-learn", "torch"),
    "scapy": ("scapy", "capture"),
}


class MissingExtra(RuntimeError):
    """An optional package a command needs is not installed (the message names its extra)."""


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
    """Raise :class:`MissingExtra` unless ``module`` is installed; ``purpose``
    says what needs it (``"plotting"``, ``"switchml cluster run"``)."""
    if not available(module):
        raise MissingExtra(missing_message(module, purpose))


def explain(exc: ImportError, purpose: str) -> str:
    """One line for an ImportError met while doing ``purpose``: which extra to
    install when the missing module is one of ours, else the error itself."""
    top = (exc.name or "").split(".")[0]
    return missing_message(top, purpose) if top in EXTRAS else f"{purpose}: {exc}"
