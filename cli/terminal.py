"""The one object that owns the terminal: stdout and stderr consoles, messages."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape


class CLIError(click.ClickException):
    """An expected failure: printed as one line on stderr, exit code 1 (or ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = code

    def show(self, file=None) -> None:
        terminal.error(self.format_message())


class Terminal:
    """stdout for results, stderr for everything said about them."""

    def __init__(self) -> None:
        self.out = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)

    # Messages are plain text: escaped, so that ``pip install "switchml-emu[torch]"``
    # keeps its brackets instead of being read as rich markup.
    def error(self, message: str) -> None:
        self.err.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)

    def warning(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)

    def info(self, message: str) -> None:
        self.err.print(message, markup=False, soft_wrap=True)

    def success(self, message: str) -> None:
        self.err.print(f"[green]{escape(message)}[/]", soft_wrap=True)

    def show(self, renderable) -> None:
        """Print a view (``stats``, a frame of ``top``) on stdout. In a terminal
        it fits the window; into a pipe or a file every line is as wide as its
        content needs, so that no line breaks inside a value (rich would wrap
        at its default 80 columns there, ``switch pkts in`` on one line and its
        number on the next)."""
        from rich.measure import Measurement

        if self.out.is_terminal:
            self.out.print(renderable)
            return
        wide = self.out.options.update_width(1 << 16)
        needed = Measurement.get(self.out, wide, renderable).maximum
        width = self.out.width  # print(width=) only narrows: widen the console itself
        self.out.width = max(width, needed)
        try:
            self.out.print(renderable)
        finally:
            self.out.width = width


terminal = Terminal()


def parse_size(text: str) -> int:
    """``16Mi``, ``1MiB``, ``4k``, ``1000000`` -> an integer (:func:`swemu.options.parse_size`);
    :class:`click.BadParameter` for anything else."""
    from swemu.options import parse_size as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class SizeType(click.ParamType):
    """A click parameter for sizes with suffixes."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


SIZE = SizeType()
