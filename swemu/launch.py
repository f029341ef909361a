"""The launcher's old address, kept for users: :mod:`swemu.serving.launch`.

``swemu.launch.EmulatorProcess``, ``spawn``, ``die_with_parent`` and the other
public names of the launcher keep working from here; the project itself
imports :mod:`swemu.serving.launch`.

May import: swemu.serving.launch.
"""

from swemu.serving.launch import (
    CHILD_CWD,
    DIR_PREFIX,
    PR_SET_PDEATHSIG,
    EmulatorProcess,
    child_env,
    die_with_parent,
    numba_cache_env,
    spawn,
    sweep_stale_dirs,
    torchrun_envs,
)

__all__ = [
    "CHILD_CWD",
    "DIR_PREFIX",
    "PR_SET_PDEATHSIG",
    "EmulatorProcess",
    "child_env",
    "die_with_parent",
    "numba_cache_env",
    "spawn",
    "sweep_stale_dirs",
    "torchrun_envs",
]
