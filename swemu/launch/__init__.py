"""The launcher: start child processes that die with their parent, an emulator among them.

Used by ``switchml run`` (its embedded emulator and its workers), the pytest
plugin, the end-to-end tests, the emulated rack, the calibration and the
benchmarks. Children are started by command lines (``python -m cli.main serve``,
``python -m cli.worker``), so this package imports nothing of the project: it
sits below everything that launches.

- :mod:`.process`: :func:`spawn`, :func:`wait_all`, :func:`die_with_parent`, :func:`child_env`,
  :data:`CHILD_CWD`, :func:`numba_cache_env` (process hygiene, Numba's cache);
- :mod:`.emulator`: :class:`EmulatorProcess` (``switchml-emu serve`` on free
  ports) and its temporary directories (:func:`sweep_stale_dirs`);
- :mod:`.child`: the emulator's child program (run a module, remove a directory);
- :mod:`.watch`: :class:`Watched`, a child whose every wait ends when it exits
  (:class:`ChildFailed` with its exit status and stderr), and :func:`run`;
- :mod:`.torchrun`: :func:`torchrun_envs`, what torchrun sets for each rank.

May import: nothing of the project.
"""

from .emulator import DIR_PREFIX, EmulatorProcess, sweep_stale_dirs
from .process import (
    CHILD_CWD,
    PR_SET_PDEATHSIG,
    child_env,
    die_with_parent,
    numba_cache_env,
    spawn,
    wait_all,
)
from .torchrun import torchrun_envs
from .watch import ChildFailed, Watched, run

__all__ = [
    "CHILD_CWD",
    "DIR_PREFIX",
    "PR_SET_PDEATHSIG",
    "ChildFailed",
    "EmulatorProcess",
    "Watched",
    "child_env",
    "die_with_parent",
    "numba_cache_env",
    "run",
    "spawn",
    "sweep_stale_dirs",
    "torchrun_envs",
    "wait_all",
]
