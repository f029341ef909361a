"""The README's stated defaults, held against the tool's own option objects.

Each statement of a default in README.md (the ``serve`` and ``run`` options, the
sample run's title line, the host library's options) is found by a pattern and
compared with what the tool itself would do: the click option's default, or, for
a default the tool computes, the text of its ``--help`` and the constants behind
that text. A default changed in the code, or a README edited by hand, fails
here instead of drifting apart. A figure the README quotes from
docs/performance.md's current figures is held against that page the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from cli.run import run as run_command
from cli.serve import serve as serve_command
from hostlib import client
from swemu.options import parse_size
from swemu.protocol import wire
from swemu.protocol.worker.protocol import Timing

ROOT = Path(__file__).resolve().parent.parent


def flattened(relative: str) -> str:
    """A markdown file of the project, its whitespace runs made single spaces."""
    return " ".join((ROOT / relative).read_text().split())


README = flattened("README.md")
PERFORMANCE = flattened("docs/performance.md")


def said(pattern: str, text: str = README, where: str = "the README") -> str:
    """What ``text`` (the README unless told) says where ``pattern`` (on its
    whitespace-flattened text) has its group 1; the statement must be there."""
    m = re.search(pattern, text)
    assert m is not None, f"{where} no longer says {pattern!r}"
    return m.group(1)


def option(command: click.Command, name: str) -> click.Option:
    return next(p for p in command.params if p.name == name)


def default(command: click.Command, name: str):
    """An option's default as the command converts it (``"1GiB"`` -> bytes, ...)."""
    opt = option(command, name)
    return opt.type_cast_value(click.Context(command), opt.default)


def help_default(command: click.Command, name: str) -> str:
    """The ``[default: ...]`` text of a computed default in the option's help."""
    text = " ".join(option(command, name).help.split())
    m = re.search(r"\[default: (.*)\]", text)
    assert m is not None, text
    return m.group(1)


@pytest.mark.parametrize("name", ["host", "port", "control_port", "pool_size", "pcap_max_bytes"])
def test_the_serve_usage_lines_defaults(name):
    """``switchml-emu serve [--host 0.0.0.0] [--port 48864] ...``: each bracket
    shows the option with its default."""
    flag = "--" + name.replace("_", "-")
    value = said(rf"\[{flag} (\S+?)\]")
    want = default(serve_command, name)
    assert (parse_size(value) if name == "pcap_max_bytes" else type(want)(value)) == want


def test_the_serve_limits_and_lifetime_defaults():
    assert int(said(r"`--max-workers` \((\d+) per job\)")) == default(serve_command, "max_workers")
    assert int(said(r"`--max-jobs` \((\d+)\)")) == default(serve_command, "max_jobs")
    budget = said(r"`--max-pool-memory` \((\S+) for all pools\)")
    assert parse_size(budget) == default(serve_command, "max_pool_memory")
    idle = said(r"after `--idle-timeout` seconds without traffic \(default (\d+)\)")
    assert float(idle) == default(serve_command, "idle_timeout")
    evict = said(r"if idle `--evict-after` seconds \(default (\d+)\)")
    assert float(evict) == default(serve_command, "evict_after")


def test_the_run_options_plain_defaults():
    assert int(said(r"`--shards S` [^()]*\(default (\d+)\)")) == default(run_command, "shards")
    no_progress = said(r"`--no-progress SECONDS` [^()]*\(default (\d+)\)")
    assert float(no_progress) == default(run_command, "no_progress")


def test_the_run_packet_size_default_is_the_help_and_the_code():
    """The README says what ``--help`` says, and its numbers are the codes the
    launcher and the host library use."""
    text = said(r"`--packet-size CODE` sets .*?default: (.*?\(Tofino-compatible\) on hardware)")
    assert text == help_default(run_command, "packet_size")
    assert option(run_command, "packet_size").default is None  # computed: asked of the switch
    emulator = int(re.search(r"fastest \((\d)\)", text).group(1))
    hardware = int(re.search(r"(\d) \(Tofino-compatible\)", text).group(1))
    assert (emulator, hardware) == (wire.EMULATOR_SIZE_CODE, wire.HARDWARE_DEFAULT_SIZE_CODE)
    # the host library's own option says the same
    lib = said(
        r"`packet_size` \(size code; default: the emulator's fastest, (\d, against an "
        r"emulator, \d), Tofino-compatible, against hardware\)"
    )
    assert re.findall(r"\d", lib) == [str(emulator), str(hardware)]


def test_the_run_window_default_is_the_help_and_the_function():
    """The window's default as the README and ``--help`` state it (in flight for
    the whole job, per worker bounds, a cap in slots) is what
    :func:`hostlib.client.default_window` computes."""
    text = said(r"`--window K` the slots in flight per worker \(default: (.*?slots)\)")
    assert text == help_default(run_command, "window")
    m = re.fullmatch(
        r"about (\d+) MiB in flight for the whole job, (\d+) KiB to (\d+) MiB per worker, "
        r"at most (\d+) slots",
        text,
    )
    assert m is not None, text
    job, low, high, cap = (int(g) for g in m.groups())
    assert (job << 20, low << 10, high << 20) == (
        client.IN_FLIGHT_BYTES,
        client.IN_FLIGHT_MIN,
        client.IN_FLIGHT_MAX,
    )
    assert client.default_window(0, 1) == cap  # small packets: the cap
    for code in (3, 6, 7):
        for w in (1, 2, 4, 8, 16, 32):
            per_worker = client.default_window(code, w) * wire.packet_len(code)
            assert low * 0.9 <= per_worker <= high << 20 or client.default_window(code, w) == cap


def test_the_quick_start_and_the_sample_run_are_the_defaults():
    """``switchml run --workers 4`` as the Quick start describes it and as the
    sample shows it: the default size, dtype, size code, window and iterations."""
    size, dtype = said(r"4 workers allreduce (\d+ MiB \w+) tensors").split(" MiB ")
    assert int(size) << 20 == default(run_command, "size")
    assert dtype == default(run_command, "dtype")
    title = said(r"(switchml run: 4 workers, [^┏]*?window \d+)")
    code = int(wire.EMULATOR_SIZE_CODE)
    window = client.default_window(code, 4)
    shown = f"switchml run: 4 workers, {size} MiB {dtype}, size code {code}, window {window}"
    assert title == shown
    iters = default(run_command, "iters")
    assert int(said(r"all 4 workers verified (\d+) results")) == iters
    rows = re.findall(r"│ +(\d+) │ +[\d.]+ │ +[\d.]+ │ +\d+ │ +ok │", README)
    assert [int(r) for r in rows] == list(range(iters))


def test_the_host_librarys_timer_defaults():
    timing = Timing()
    assert float(said(r"`timeout` \((\d+) ms, then adaptive\)")) == timing.timeout * 1000
    assert float(said(r"`no_progress` \((\d+) s\)")) == timing.no_progress
    assert int(said(r"`SWITCHML_WORKER_PORT`, default (\d+)\)")) == client.DEFAULT_WORKER_PORT


def test_the_first_run_figures_agree_between_quick_start_and_results():
    """The README's Quick start and the current figures of docs/performance.md
    quote the same measurement of a first ``switchml run --workers 4`` against a
    warm one."""
    quick = said(r"a first `switchml run --workers 4` took ([\d.–]+ s against [\d.–]+ s)")
    results = said(
        r"## The current figures (?:(?!## ).)*?`bench firstrun`, [^|]*\|[^|]*"
        r"\(cold ([\d.–]+ s vs warm [\d.–]+ s)\)",
        PERFORMANCE,
        "docs/performance.md",
    )
    assert quick == results.replace(" vs warm ", " against ")
