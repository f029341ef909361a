"""hostlib: the worker side of SwitchML — allreduce through a SwitchML switch.

Works against the emulator (``switchml-emu serve``) and against a Tofino running
the mirror P4 program alike: it uses only the wire protocol and the gRPC
control plane. ::

    import hostlib
    with hostlib.connect(switch="127.0.0.1:48864", control="127.0.0.1:50099",
                         rank=r, world_size=W) as ctx:
        y = ctx.allreduce(x)          # int32 exact, float32 by block floating point
        ctx.allreduce(x, out=x)       # in place
        y16 = ctx.allreduce(x16)      # float16 (or bfloat16): 16 bits a value on the wire
        y = ctx.allreduce(x, values16=True)   # float32 on the 16-bit wire too

    async with hostlib.aconnect(...) as actx:
        y = await actx.allreduce(x)

    ctx = hostlib.from_env()          # inside `switchml run --workers N -- CMD`

Integrations: :mod:`hostlib.torch` (a torch.distributed backend and a DDP hook)
and :mod:`hostlib.tensorflow` (TensorFlow/Keras with Horovod's API); only they
import torch or TensorFlow, so ``import hostlib`` needs neither.

May import: swemu.protocol only (the pytest plugin, loaded by pytest, launches
an emulator: swemu.launch).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from swemu.protocol.worker.protocol import Timing

from .client import AsyncContext, Options
from .errors import ControlPlaneError, NoProgressError, SwitchMLError
from .results import ResultPool

__all__ = [
    "AsyncContext",
    "Context",
    "ControlPlaneError",
    "NoProgressError",
    "Options",
    "SwitchMLError",
    "Timing",
    "aconnect",
    "connect",
    "from_env",
    "switch_env_options",
]

ENV_PREFIX = "SWITCHML_"


def _options(**kwargs: Any) -> Options:
    timing_keys = ("timeout", "backoff_after", "max_timeout", "no_progress", "reorder_guard")
    timing = {k: kwargs.pop(k) for k in timing_keys if kwargs.get(k) is not None}
    for k in timing_keys:
        kwargs.pop(k, None)
    if timing:
        kwargs["timing"] = Timing(**timing)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return Options(**kwargs)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Context:
    """Blocking wrapper of :class:`AsyncContext` with a private event loop."""

    def __init__(self, options: Options) -> None:
        self._loop = _new_loop()
        self._actx = AsyncContext(options, blocking=True)

    @property
    def options(self) -> Options:
        """The options in force (the packet size and window are filled in when
        joining, if they were left to their defaults)."""
        return self._actx.options

    def __enter__(self) -> Context:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> Context:
        """Join the job (done on first use if not called)."""
        self._loop.run_until_complete(self._actx.open())
        return self

    def allreduce(
        self,
        x: np.ndarray,
        out: np.ndarray | None = None,
        *,
        values16: bool | None = None,
        bfloat16: bool = False,
    ) -> np.ndarray:
        """Sum ``x`` over all workers; a new array, or ``out`` (may be ``x``).

        ``x`` is int32 (exact sums), float32 (block floating point,
        docs/protocol.md §4), float16 or bfloat16 (an ml_dtypes array, or with
        ``bfloat16=True`` a uint16/int16 array of bfloat16 bit patterns, such as a
        torch tensor's memory); the result has ``x``'s type. float16 and bfloat16
        travel as 16-bit values (§4.2: twice the values per packet, both ways) and
        float32 too with ``values16=True`` (or ``connect(values16=True)``);
        ``values16=False`` keeps a 16-bit tensor on the 32-bit wire. A switch that
        does not offer the 16-bit format gets 32-bit values whatever is asked.
        Every worker must make the same call (dtype, length, ``values16``).

        On the compiled fast path the call waits in compiled code
        (:meth:`AsyncContext.allreduce_blocking`), not in the event loop."""
        actx = self._actx
        if actx.protocol is None:
            self.open()
        if actx.can_block:
            return actx.allreduce_blocking(x, out, values16=values16, bfloat16=bfloat16)
        return self._loop.run_until_complete(
            actx.allreduce(x, out, values16=values16, bfloat16=bfloat16)
        )

    def close(self) -> None:
        """Leave the job (telling the controller: the last worker to leave frees
        it on the switch) and free the socket and the loop."""
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self._actx.aclose())
        finally:
            self._actx.close()
            self._loop.close()

    @property
    def session_id(self) -> int | None:
        m = self._actx.membership
        return m.session_id if m else None

    @property
    def switch_address(self) -> str:
        """``IP:PORT`` of the switch's data plane (its first port if several):
        the one given, or the one the controller named when joining."""
        return self._actx.switch_address

    @property
    def values16_available(self) -> bool:
        """Whether the switch offers this job the 16-bit format (docs/protocol.md
        §4.2); without it every call travels as 32-bit values."""
        return self._actx.values16_available

    @property
    def results(self) -> ResultPool:
        """The memory of results returned without ``out=`` (reused once the
        caller drops them; :mod:`hostlib.results`)."""
        return self._actx.results

    @property
    def rank(self) -> int:
        return self.options.rank

    @property
    def world_size(self) -> int:
        return self.options.world_size

    @property
    def last_stats(self) -> dict[str, int]:
        """Counters of the last call: ``sent`` packets, ``results``,
        ``retransmissions``, ``spurious`` (duplicate results: retransmissions
        that were not needed), ``ignored`` datagrams, socket ``wakeups``, and
        ``values16`` (1: the call sent 16-bit values, docs/protocol.md §4.2)."""
        return dict(self._actx.last_stats)


def connect(
    switch: str | None = None,
    control: str | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    packet_size: int | None = None,
    window: int | None = None,
    session_id: int | None = None,
    timeout: float | None = None,
    backoff_after: int | None = None,
    max_timeout: float | None = None,
    no_progress: float | None = None,
    reorder_guard: float | None = None,
    connect_timeout: float | None = None,
    join_timeout: float | None = None,
    bind: str | None = None,
    gso: bool | None = None,
    release: bool | None = None,
    worker_port: int | None = None,
    values16: bool | None = None,
) -> Context:
    """Join a SwitchML job (blocking API); use as a context manager.

    ``switch``/``control`` are ``HOST:PORT`` (defaults: the controller at
    127.0.0.1:50099, the data plane wherever the controller says). ``packet_size``
    is a size code (default: the emulator's fastest, 6, when the controller says
    it is an emulator; 3 = 256 values on hardware), ``window`` the slots in
    flight per worker (default: about 3 MiB in flight for the whole job, 256 KiB
    to 1 MiB per worker, at most 512 slots; at W = 4, 95 at code 6 and 512 at
    code 3: :func:`hostlib.client.default_window`). ``timeout``,
    ``backoff_after``, ``max_timeout``, ``no_progress`` and ``reorder_guard``
    set retransmission, failure detection and protection against reordering
    networks (see :class:`Timing`). ``gso=False`` turns off UDP segmentation
    offload (on by default where the kernel and the route allow it; the switch
    sees the same datagrams either way, and ``SWITCHML_GSO=0`` also turns it off).
    ``release=False`` leaves the job on the switch when the context closes (to
    read its counters afterwards with ``switchml-emu stats``; the emulator frees
    it once idle, docs/lifetime.md); by default the last worker to close frees it.

    ``bind`` is the local IP to send from (default: the route to the switch).
    ``worker_port`` (default ``$SWITCHML_WORKER_PORT``, else 4000, p4app-switchML's
    ``worker_port``) is the UDP port every worker of the job sends from and listens
    on when the switch knows workers by IP alone (p4app-switchML's Tofino program):
    used when the switch says so in its reply, or, when it does not say, when
    every worker of the job has its own IP. Otherwise each worker has its own
    ephemeral port. See docs/p4app-switchml.md.

    ``values16=True`` sends float32 tensors as 16-bit values too (docs/protocol.md
    §4.2; float16 and bfloat16 ones always are, where the switch offers the format);
    ``SWITCHML_VALUES16=1`` sets it from the environment.
    """
    return Context(_options(**_kwargs(locals())))


def aconnect(
    switch: str | None = None,
    control: str | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    packet_size: int | None = None,
    window: int | None = None,
    session_id: int | None = None,
    timeout: float | None = None,
    backoff_after: int | None = None,
    max_timeout: float | None = None,
    no_progress: float | None = None,
    reorder_guard: float | None = None,
    connect_timeout: float | None = None,
    join_timeout: float | None = None,
    bind: str | None = None,
    gso: bool | None = None,
    release: bool | None = None,
    worker_port: int | None = None,
    values16: bool | None = None,
) -> AsyncContext:
    """The asyncio twin of :func:`connect`: ``async with hostlib.aconnect(...) as actx``."""
    return AsyncContext(_options(**_kwargs(locals())))


def _kwargs(local: dict[str, Any]) -> dict[str, Any]:
    return dict(local)


def switch_env_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The switch's connection arguments from ``SWITCHML_*`` variables alone (no
    rank, world size or session id): SWITCHML_SWITCH, SWITCHML_CONTROL,
    SWITCHML_PACKET_SIZE, SWITCHML_WINDOW, SWITCHML_NO_PROGRESS,
    SWITCHML_CONNECT_TIMEOUT, SWITCHML_JOIN_TIMEOUT, SWITCHML_RELEASE (0: leave
    the job on the switch when closing) and SWITCHML_VALUES16 (1: float32 tensors on
    the 16-bit wire, docs/protocol.md §4.2). Unset or empty variables are left out, so
    that :func:`connect`'s defaults apply. Shared by :func:`env_options` and the
    ``switchml`` torch.distributed backend (:mod:`hostlib.torch_backend`)."""
    env = os.environ if environ is None else environ

    def get(name: str, kind: type) -> Any:
        text = env.get(ENV_PREFIX + name, "").strip()
        if not text:
            return None
        try:
            return kind(text)
        except ValueError:
            raise SwitchMLError(
                f"{ENV_PREFIX}{name}={text!r} is not a valid {kind.__name__}"
            ) from None

    out = {
        "switch": env.get(ENV_PREFIX + "SWITCH") or None,
        "control": env.get(ENV_PREFIX + "CONTROL") or None,
        "packet_size": get("PACKET_SIZE", int),
        "window": get("WINDOW", int),
        "no_progress": get("NO_PROGRESS", float),
        "connect_timeout": get("CONNECT_TIMEOUT", float),
        "join_timeout": get("JOIN_TIMEOUT", float),
        "release": env.get(ENV_PREFIX + "RELEASE", "1") != "0",
        "values16": env.get(ENV_PREFIX + "VALUES16", "0").strip() not in ("", "0"),
    }
    return {k: v for k, v in out.items() if v is not None}


def env_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Connection arguments from the environment ``switchml run`` sets:
    RANK, WORLD_SIZE (as torchrun), SWITCHML_SESSION_ID and the variables of
    :func:`switch_env_options`."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        raise SwitchMLError(
            "RANK and WORLD_SIZE are not set: start this program with "
            "`switchml run --workers N -- python ...`"
        )
    session = env.get(ENV_PREFIX + "SESSION_ID")
    return {
        "rank": int(env["RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "session_id": int(session) if session else None,
        **switch_env_options(env),
    }


def from_env(**overrides: Any) -> Context:
    """A :class:`Context` configured from the environment (see :func:`env_options`)."""
    return connect(**{**env_options(), **overrides})
