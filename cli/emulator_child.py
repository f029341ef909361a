"""The emulator child of :class:`swemu.serving.launch.EmulatorProcess`.

``python -m cli.emulator_child DIR serve ...`` runs ``switchml-emu serve ...``
and removes DIR when it ends. The launcher starts it by this command line,
not by an import: the serving layer never imports the CLI.
"""

from __future__ import annotations

import shutil
import signal
import sys


def _emulator_main(argv: list[str]) -> None:
    """``python -m cli.emulator_child DIR serve ...``: run ``switchml-emu serve ...``
    and remove DIR when it ends, so that an emulator stopped during its start-up
    (its launcher gone, SIGTERM from :func:`swemu.serving.launch.spawn`) leaves no
    directory."""
    directory, args = argv[0], argv[1:]
    signal.signal(signal.SIGTERM, _exit_143)  # until serve installs its own handlers
    try:
        from cli.main import emu_main

        sys.argv = ["switchml-emu", *args]
        emu_main()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _exit_143(signum: int, frame: object) -> None:
    raise SystemExit(143)


if __name__ == "__main__":
    _emulator_main(sys.argv[1:])
