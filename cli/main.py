"""Root command groups and entry points.

``switchml-emu`` holds the switch's commands, ``switchml`` the workers'. The
entry points turn expected errors into one line on stderr and a non-zero exit
status instead of a traceback, end quietly when their output pipe is closed
(``| head``), and keep gRPC's C core from logging on its own.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from pathlib import Path

import click

from .terminal import CLIError, terminal


class ClosedPipe(Exception):
    """A write met a pipe whose reader went away (a BrokenPipeError, carried past
    click, which would make it exit status 1)."""


class LazyGroup(click.Group):
    """A group whose commands live in ``cli.<name>`` modules, imported on use,
    so that ``--help`` and every command start without importing the others."""

    def __init__(self, *args, lazy: tuple[str, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def _available(self) -> list[str]:
        here = Path(__file__).parent
        return [name for name in self.lazy if (here / f"{name}.py").exists()]

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._available()))

    def invoke(self, ctx: click.Context):
        # click turns EPIPE into exit status 1; _main decides (0 if stdout's reader left)
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise ClosedPipe(str(exc)) from None

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        if name not in self._available():
            return None
        module = importlib.import_module(f"cli.{name}")
        return getattr(module, name)


#: ``switchml-emu`` commands (the switch) and ``switchml`` commands (the workers)
EMU_COMMANDS = ("serve", "stats", "top", "decode")  # capture: serve --pcap
SWITCHML_COMMANDS = ("run", "bench", "simulate", "cluster")


@click.group(
    cls=LazyGroup, lazy=EMU_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="switchml-emu")
def emu() -> None:
    """switchml-emu: a software SwitchML switch."""


@click.group(
    cls=LazyGroup,
    lazy=SWITCHML_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="switchml-emu")
def switchml() -> None:
    """switchml: run SwitchML workers against an emulator or a Tofino."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that it unwinds like Ctrl-C:
    ``switchml run`` and the benchmarks stop their workers and their local
    emulator instead of leaving them running. (``serve`` installs its own
    handlers in its event loop.)"""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def quiet_grpc() -> None:
    """Silence gRPC's C-core log (e.g. its ``E… add_port.cc`` line before our own
    one-line "cannot listen" error) unless the user chose a verbosity. Must run
    before grpc is imported; child processes (a local emulator) inherit it."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def _stdout_closed() -> bool:
    """True when stdout is a pipe or socket whose reader went away."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # POLLERR is always reported
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _closed_pipe() -> None:
    """stdout's reader went away (``switchml-emu decode x.pcap | head``): point
    stdout at /dev/null so that the interpreter's final flush does not fail
    again, and end with status 0, as ``cat`` would."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(0)


def _main(group: click.Group) -> None:
    quiet_grpc()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        rc = group.main(standalone_mode=False)
    except (Terminated, click.exceptions.Abort) as exc:
        # click turns KeyboardInterrupt (and so Terminated) into Abort
        if isinstance(exc, Terminated) or isinstance(exc.__cause__, Terminated):
            terminal.error("terminated")
            sys.exit(143)
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
    except (BrokenPipeError, ClosedPipe) as exc:
        if _stdout_closed():
            _closed_pipe()
        terminal.error(str(exc))
        sys.exit(1)
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
