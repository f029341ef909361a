"""Root command groups and entry points.

``switchml-emu`` holds the switch's commands, ``switchml`` the workers'. The
entry points turn expected errors into one line on stderr and a non-zero exit
status instead of a traceback.
"""

from __future__ import annotations

import sys

import click

from .terminal import CLIError, terminal


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="switchml-emu")
def emu() -> None:
    """switchml-emu: a software SwitchML switch."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="switchml-emu")
def switchml() -> None:
    """switchml: run SwitchML workers against an emulator or a Tofino."""


def _register() -> None:
    from . import run, serve

    emu.add_command(serve.serve)
    switchml.add_command(run.run)


def _main(group: click.Group) -> None:
    _register()
    try:
        rc = group.main(standalone_mode=False)
    except click.exceptions.Abort:
        terminal.error("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        if isinstance(exc, CLIError):
            exc.show()
        else:
            terminal.error(exc.format_message())
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        terminal.error(str(exc))
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)


def emu_main() -> None:
    """Entry point of ``switchml-emu``."""
    _main(emu)


def switchml_main() -> None:
    """Entry point of ``switchml``."""
    _main(switchml)


if __name__ == "__main__":  # python -m cli.main (switchml-emu)
    emu_main()
