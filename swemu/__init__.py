"""switchml-emu: a software SwitchML switch.

``swemu.protocol.wire`` (the packet codec) and ``swemu.protocol.proto`` (the gRPC stubs) are the
protocol, shared with the host library; everything else here is the emulator.
Heavy modules (Numba kernels, the server) load lazily, so that importing the
codec stays cheap.
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
