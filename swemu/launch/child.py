"""The emulator child of :class:`swemu.launch.emulator.EmulatorProcess`.

``python -m swemu.launch.child DIR MODULE ARGS...`` runs ``python -m MODULE
ARGS...`` in this process and removes DIR when it ends, so that an emulator
stopped during its start-up (its launcher gone, SIGTERM from
:func:`swemu.launch.spawn`) leaves no directory. The module is named on the
command line (``cli.main serve ...``), not imported here: the launcher knows
the command, never the CLI's code.
"""

from __future__ import annotations

import runpy
import shutil
import signal
import sys


def main(argv: list[str]) -> None:
    """Run ``python -m MODULE ARGS...`` (``argv`` = DIR, MODULE, ARGS...), then remove DIR."""
    if len(argv) < 2:
        raise SystemExit("usage: python -m swemu.launch.child DIR MODULE [ARGS...]")
    directory, module, args = argv[0], argv[1], argv[2:]
    signal.signal(signal.SIGTERM, _exit_143)  # until the command installs its own handlers
    try:
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _exit_143(signum: int, frame: object) -> None:
    raise SystemExit(143)


if __name__ == "__main__":
    main(sys.argv[1:])
