"""switchml-emu: a software SwitchML switch.

Four layers, each importing only those before it (docs/design.md, "Layout"):
``swemu.protocol`` (the codec, the gRPC stubs, compiled UDP I/O: shared with the
host library), ``swemu.core`` (the switch, sans-IO), ``swemu.observe`` (stats,
metrics, TUI, captures) and ``swemu.serving`` (the switch on sockets and gRPC).
This package is a facade: ``swemu.serve``, ``swemu.Emulator``,
``swemu.SwitchEngine`` and the rest load their modules lazily, so that
importing the codec stays cheap. Beside the layers: ``swemu.launch`` (the launcher),
``swemu.options``, ``swemu.model`` (the scale model), ``swemu.rack`` (the emulated rack).

May import: its subpackages (lazily, by attribute).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swemu.protocol.version import __version__

_LAZY = {
    "serve": "swemu.serving.server",
    "Emulator": "swemu.serving.server",
    "ShardedEmulator": "swemu.serving.shards",
    "SwitchEngine": "swemu.core.engine",
    "EngineConfig": "swemu.core.engine",
    "Batch": "swemu.core.engine",
    "Action": "swemu.core.engine",
    "RegistrationError": "swemu.core.engine",
}

if TYPE_CHECKING:
    from swemu.core.engine import Action, Batch, EngineConfig, RegistrationError, SwitchEngine
    from swemu.serving.server import Emulator, serve
    from swemu.serving.shards import ShardedEmulator

__all__ = [
    "Action",
    "Batch",
    "Emulator",
    "EngineConfig",
    "RegistrationError",
    "ShardedEmulator",
    "SwitchEngine",
    "__version__",
    "serve",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swemu' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
