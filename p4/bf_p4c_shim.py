"""Run p4c's ``bf-p4c`` driver with one known driver bug worked around (used by build.sh).

bf-p4c's Python driver (p4c ``tools/driver/p4c_src``) stores the result of
``find_file()`` as a command. Since p4c #5692 that result is a ``pathlib.Path``, and
``BarefootBackend.checkAndRunCmd`` then calls ``cmd[0].find('/')`` on it, so every
compile that gets as far as the assembler (``bfas``) stops with::

    AttributeError: 'PosixPath' object has no attribute 'find'

after the back end has written ``context.json`` and its logs but before ``tofino.bin``,
the resource summary (``p4c-build-logs``) and the ``bf-rt.json`` check. p4c #5750
(merged 2026-09) fixes it upstream by normalising commands to ``str``; p4c 34b86e9bac
(2026-08), the revision built here, predates it. This wrapper does the same
normalisation from the outside, in memory, then runs the unchanged driver script: the
compiler is not modified, and with a fixed driver the patch changes nothing
(``os.fspath`` of a ``str`` is the ``str``).

usage: python3 bf_p4c_shim.py /path/to/bf-p4c [bf-p4c options...]
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def artifacts_dir(script: Path) -> Path:
    """Where the driver script finds ``p4c_src``: beside it (a build directory) or in
    ``../share/p4c`` (an installed compiler), as the script itself decides."""
    here = script.resolve().parent
    return here if (here / "p4c_src").is_dir() else (here.parent / "share" / "p4c")


def patch_driver(artifacts: Path) -> None:
    """Make ``BackendDriver.add_command`` store commands as ``str`` (p4c #5750)."""
    sys.path.insert(1, str(artifacts))
    from p4c_src import driver  # type: ignore[import-not-found]

    original = driver.BackendDriver.add_command

    def add_command(self: object, cmd_name: str, cmd: str | os.PathLike[str]) -> None:
        original(self, cmd_name, os.fspath(cmd))

    driver.BackendDriver.add_command = add_command


def main(argv: list[str]) -> None:
    """Run the driver script ``argv[0]`` with arguments ``argv[1:]``."""
    if not argv:
        sys.exit("bf_p4c_shim.py: usage: bf_p4c_shim.py /path/to/bf-p4c [options...]")
    script = Path(argv[0])
    patch_driver(artifacts_dir(script))
    sys.argv = [str(script), *argv[1:]]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
