"""The ``switchml`` torch.distributed backend: ``dist.init_process_group("switchml")``.

``import hostlib.torch`` registers it. Under torchrun (or ``switchml run``), with
``SWITCHML_CONTROL=HOST:PORT`` naming a running switch's control plane::

    import torch.distributed as dist
    import hostlib.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("switchml")
    model = torch.nn.parallel.DistributedDataParallel(net)   # no hook needed

What goes where:

- ``all_reduce`` with ``ReduceOp.SUM`` or ``AVG`` of one CPU tensor of float32,
  float16, bfloat16 or int32 goes through the switch (int32 exact, float32 by block
  floating point, docs/protocol.md §4), from the tensor's own memory: float16 and
  bfloat16 as 16-bit values (§4.2, no float32 copy; 32-bit ones where the switch
  does not offer the format), float32 too with ``SWITCHML_VALUES16=1``; float64
  travels as float32 (a staging copy) and comes back as float64. DDP's gradient
  buckets are such calls, and so are those of torch's ``fp16_compress_hook`` and
  ``bf16_compress_hook`` registered on a DDP model of this group: 16 bits a value
  through the switch, both ways.
- Everything else -- broadcast, barrier, all_gather, reduce_scatter, send/recv,
  other reduce ops, other dtypes, allreduce of several tensors at once -- goes to
  a gloo process group created beside it over the same rendezvous store.

Each process group (the default one and every ``dist.new_group(backend="switchml")``)
is a SwitchML job of its own: its rank 0 picks a session id and hands it to the
others through the launcher's store (not an environment variable), then all join
(docs/protocol.md §3). The switch's traffic of a group runs on one background
thread, in the order the calls were made -- the same on every rank, as SwitchML
needs (DDP launches its buckets in index order on every rank). ``all_reduce``
therefore returns at once with a :class:`torch.distributed.Work` whose
``wait()`` and ``get_future()`` complete when the switch has answered, so DDP's
bucket reductions overlap the rest of backward. ``SWITCHML_OVERLAP=0`` (or
:attr:`SwitchMLProcessGroup.overlap` = False) makes each call wait for its result
before returning, which is how the overlap is measured (``python -m bench overlap``).

Configuration (environment, read when a group is created): ``SWITCHML_CONTROL``
(required), ``SWITCHML_SWITCH``, ``SWITCHML_PACKET_SIZE``, ``SWITCHML_WINDOW``,
``SWITCHML_NO_PROGRESS``, ``SWITCHML_CONNECT_TIMEOUT``, ``SWITCHML_JOIN_TIMEOUT``,
``SWITCHML_RELEASE``, ``SWITCHML_VALUES16`` (see :func:`hostlib.switch_env_options`) and
``SWITCHML_OVERLAP``; ``SWITCHML_SESSION_ID`` is ignored here. docs/pytorch.md
has the table with defaults.

``dist.destroy_process_group()`` stops the thread and releases the job on the
switch (the last rank's release frees it, docs/lifetime.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import Context, Options, _options, switch_env_options
from .errors import SwitchMLError

__all__ = [
    "BACKEND_NAME",
    "SwitchMLProcessGroup",
    "attempt_store",
    "backend_options",
    "register",
]

log = logging.getLogger("hostlib.torch")

#: the name given to ``dist.init_process_group`` and ``dist.new_group(backend=...)``
BACKEND_NAME = "switchml"
#: tensor types the switch reduces from their own memory (16-bit ones on the 16-bit
#: wire); float64 travels as float32
SWITCH_DTYPES = (torch.float32, torch.int32, torch.float16, torch.bfloat16)
STAGED_DTYPES = (torch.float64,)
#: the types whose AVG the switch computes (int32 AVG, which gloo refuses too, is delegated)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: a job of the switch thread: the call, its future, whether it runs after a failure
_Item = tuple[Callable[[], Any], torch.futures.Future, bool]
#: store key (below the group's own prefix) counting joins: one generation per
#: ``size`` joins, so a group created again after a destroy gets a fresh session
_JOINS_KEY = "switchml/joins"
#: :meth:`SwitchMLProcessGroup.switchml_stats` before the first call
_ZERO_COUNTERS: dict[str, Any] = {
    "calls": 0,
    "bytes": 0,
    "seconds": 0.0,
    "packets": 0,
    "retransmissions": 0,
    "spurious": 0,
    "delegated": 0,
    "values16": 0,
}


def backend_options(
    rank: int, world_size: int, environ: Mapping[str, str] | None = None
) -> Options:
    """The :class:`hostlib.Options` of one rank of a ``switchml`` process group,
    from the ``SWITCHML_*`` environment (session id left open: the group agrees
    on one through its store). Raises :class:`SwitchMLError` naming
    ``SWITCHML_CONTROL`` when it is not set."""
    env = os.environ if environ is None else environ
    kwargs = switch_env_options(env)
    if not kwargs.get("control"):
        raise SwitchMLError(
            "the switchml backend needs SWITCHML_CONTROL=HOST:PORT, the control plane of "
            "a running switch (`switchml-emu serve` listens on port 50099); it is not set"
        )
    return _options(rank=rank, world_size=world_size, **kwargs)


def _overlap_from_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get("SWITCHML_OVERLAP", "1").strip() not in ("0", "false", "no", "off")


class _Work(dist.Work):
    """A collective handed to the switch thread: done when its future is."""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: timedelta | None = None) -> bool:
        # the switch call ends by itself: with a result, or NoProgressError after
        # SWITCHML_NO_PROGRESS seconds without any; its error is raised here
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:
            return False
        return True

    def exception(self) -> BaseException | None:
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except Exception as exc:
            return exc
        return None

    def result(self) -> list[torch.Tensor]:
        return self._fut.value()

    def synchronize(self) -> None:
        self._fut.wait()

    def get_future(self) -> torch.futures.Future:
        return self._fut


class SwitchMLProcessGroup(dist.ProcessGroup):
    """A process group whose SUM/AVG allreduces of CPU float and int32 tensors go
    through a SwitchML switch, and whose other collectives go to a gloo group
    registered as its CPU backend (so C++ callers such as DDP's parameter
    broadcast find it too). Created by ``dist.init_process_group("switchml")``
    and ``dist.new_group(backend="switchml")``; see the module docstring."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        options = backend_options(rank, size, environ)  # fails before anything starts
        super().__init__(rank, size)
        store = attempt_store(store, environ)  # never a dead attempt's keys
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        #: False: every switch allreduce waits for its result before returning
        self.overlap = _overlap_from_env(environ)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._closed = False
        self._counters = dict(_ZERO_COUNTERS)
        session_id = _agree_on_session(store, rank, size)
        self._ctx = Context(_replace_session(options, session_id))
        self._thread = threading.Thread(
            target=self._serve, name=f"switchml-{session_id:x}", daemon=True
        )
        self._thread.start()
        try:
            self._submit(self._open).wait()
        except BaseException:
            self._stop()
            raise
        _live.add(self)

    # ------------------------------------------------------------------ info
    def getBackendName(self) -> str:  # torch's name for it
        return BACKEND_NAME

    @property
    def session_id(self) -> int:
        """The SwitchML session (job) of this group on the switch."""
        return self._ctx.options.session_id

    @property
    def context(self) -> Context:
        """The group's :class:`hostlib.Context` (used by its background thread only)."""
        return self._ctx

    def switchml_stats(self) -> dict[str, Any]:
        """What went through the switch so far: ``calls``, ``bytes`` (of the tensors
        as given), ``seconds`` the background thread spent on them, ``packets``
        (chunks plus exponent packets, each a slot the switch aggregated once),
        ``values16`` (of the calls, those on the 16-bit wire, docs/protocol.md §4.2),
        ``retransmissions`` and ``spurious`` (of them, those whose first answer
        came anyway: a timeout that fired too early, e.g. while another rank was
        still computing), ``delegated`` (allreduces handed to gloo), and
        ``session_id``."""
        return {**self._counters, "session_id": self.session_id}

    def reset_stats(self) -> None:
        """Zero the counters of :meth:`switchml_stats` (e.g. after warm-up steps)."""
        self._counters.update(_ZERO_COUNTERS)

    # ----------------------------------------------------------- collectives
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """SUM/AVG of one CPU float/int32 tensor through the switch; anything else
        through gloo. Returns at once (see :attr:`overlap`)."""
        if opts is None:
            opts = dist.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = opts.reduceOp
        tensor = tensors[0] if len(tensors) == 1 else None
        switchable = (
            tensor is not None
            and tensor.device.type == "cpu"
            and not tensor.is_sparse
            and (
                (tensor.dtype in SWITCH_DTYPES + STAGED_DTYPES and op == dist.ReduceOp.SUM)
                or (tensor.dtype in FLOAT_DTYPES and op == dist.ReduceOp.AVG)
            )
        )
        if not switchable:
            self._counters["delegated"] += 1
            return self._gloo.allreduce(tensors, opts)
        average = op == dist.ReduceOp.AVG
        work = self._submit(lambda: self._reduce(tensor, average), result=[tensor])
        if not self.overlap:
            work.wait()
        return work

    def shutdown(self) -> None:
        """Stop the switch thread, release the SwitchML job, shut gloo down."""
        self._stop()
        try:
            self._gloo.shutdown()
        except (AttributeError, RuntimeError):  # an older gloo, or already down
            pass

    # ---------------------------------------------------------- the thread
    def _submit(self, fn: Callable[[], Any], result: Any = None) -> _Work:
        fut: torch.futures.Future = torch.futures.Future()
        if self._closed:
            fut.set_exception(SwitchMLError("the switchml process group was destroyed"))
        else:
            self._queue.put((lambda: (fn(), result)[1], fut, False))
        return _Work(fut)

    def _serve(self) -> None:
        """The switch thread: one call at a time, in submission order; after a
        failure every later call fails at once (the job's state is then unknown:
        the ranks may disagree on where the failed call stopped)."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut, always = item
            if self._failed is not None and not always:
                fut.set_exception(
                    SwitchMLError(
                        f"an earlier SwitchML allreduce of this group failed: {self._failed}"
                    )
                )
                continue
            try:
                value = fn()
            except BaseException as exc:  # handed to the waiting rank, never lost
                self._failed = exc
                fut.set_exception(exc)
            else:
                fut.set_result(value)

    def _open(self) -> None:
        try:
            self._ctx.open()
        except SwitchMLError as exc:
            o = self._ctx.options
            raise SwitchMLError(
                f"switchml backend, rank {o.rank} of {o.world_size}: {exc} "
                f"[SWITCHML_CONTROL={o.control}]"
            ) from None

    def _reduce(self, tensor: torch.Tensor, average: bool) -> None:
        """One switch allreduce of ``tensor`` in place (on the switch thread)."""
        start = time.perf_counter()
        ctx = self._ctx
        w = self.size()
        direct = tensor.dtype in SWITCH_DTYPES and tensor.is_contiguous()
        if direct:
            arr, bf16 = tensor_memory(tensor)
            ctx.allreduce(arr, out=arr, bfloat16=bf16)
            if average and w > 1:
                tensor.detach().div_(w)
        else:
            wire_type = torch.int32 if tensor.dtype == torch.int32 else torch.float32
            stage = tensor.detach().reshape(-1).to(wire_type, copy=True)
            arr = stage.numpy()
            ctx.allreduce(arr, out=arr)
            if average and w > 1:
                stage /= w
            with torch.no_grad():
                tensor.copy_(stage.reshape(tensor.shape))
        c = self._counters
        c["calls"] += 1
        c["bytes"] += tensor.numel() * tensor.element_size()
        last = ctx.last_stats
        c["packets"] += last.get("results", 0)  # one a chunk, plus the exponent window
        c["values16"] += int(last.get("values16", 0))
        c["retransmissions"] += last.get("retransmissions", 0)
        c["spurious"] += last.get("spurious", 0)
        c["seconds"] += time.perf_counter() - start

    def _stop(self) -> None:
        """End the thread after the calls already submitted, and leave the job
        (releasing it, unless ``SWITCHML_RELEASE=0``), even after a failed call."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._queue.put((self._ctx.close, torch.futures.Future(), True))
        self._queue.put(None)
        self._thread.join(timeout=30.0)
        if self._thread.is_alive():
            log.warning("the switchml thread of session %x did not stop", self.session_id)


def _replace_session(options: Options, session_id: int) -> Options:
    import dataclasses

    return dataclasses.replace(options, session_id=session_id)


#: the collectives handed to gloo as they are (see :func:`_delegate`)
DELEGATED = (
    "_allgather_base",
    "_reduce_scatter_base",
    "allgather",
    "allgather_coalesced",
    "allreduce_coalesced",
    "alltoall",
    "alltoall_base",
    "barrier",
    "broadcast",
    "gather",
    "monitored_barrier",
    "recv",
    "recv_anysource",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
)


def _delegate(name: str) -> Callable[..., Any]:
    """A method that hands the collective ``name`` to the group's gloo backend.

    Why not leave them to the base class, which would find gloo as the group's
    CPU backend by itself: torch's trampoline for Python process groups calls the
    base implementation with the GIL held, and gloo's worker thread, freeing the
    previous collective's tensors, needs the GIL while it holds the queue lock
    that the new collective waits for -- a deadlock seen within a few hundred
    all_gathers. Gloo's own Python binding releases the GIL before it enqueues."""

    def method(self: SwitchMLProcessGroup, *args: Any, **kwargs: Any) -> dist.Work:
        return getattr(self._gloo, name)(*args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"SwitchMLProcessGroup.{name}"
    method.__doc__ = f"``{name}`` through the group's gloo backend."
    return method


for _name in DELEGATED:
    if hasattr(dist.ProcessGroupGloo, _name):
        setattr(SwitchMLProcessGroup, _name, _delegate(_name))


def tensor_memory(tensor: torch.Tensor) -> tuple[Any, bool]:
    """A flat numpy view of a contiguous CPU tensor's memory for
    :meth:`hostlib.Context.allreduce`, and whether it holds bfloat16 patterns
    (numpy has no bfloat16: its uint16 view is sent with ``bfloat16=True``)."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bfloat16:
        return flat.view(torch.int16).numpy().view("uint16"), True
    return flat.numpy(), False


def attempt_store(store: dist.Store, environ: Mapping[str, str] | None = None) -> dist.Store:
    """The part of the launcher's ``store`` that belongs to this launch attempt
    (``TORCHELASTIC_RESTART_COUNT``, 0 without torchrun): every key the group
    writes or reads -- its gloo group's addresses, the session id -- lives there.

    Why: torchrun's default rendezvous (``static``, any run without
    ``--rdzv-backend``) serves one TCPStore for all the restarts of a job, and
    since torch 2.5 its workers use it with no per-attempt prefix (torch's
    ``rendezvous.py`` assumes a new store per attempt, which only the ``c10d``
    rendezvous makes). So after ``--max-restarts`` restarted the ranks, the store
    still held the dead ranks' gloo addresses, and the new ranks' gloo group
    connected to those closed ports ("Connection refused" in ``connectFullMesh``)
    before any of them reached the switch.
    Every rank of a group must have been started the same number of times, as
    the ranks of one torchrun are (docs/pytorch.md, Restarts)."""
    env = os.environ if environ is None else environ
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "").strip() or "0"
    return dist.PrefixStore(f"attempt/{attempt}/", store)


def _agree_on_session(store: dist.Store, rank: int, size: int) -> int:
    """The group's session id: rank 0 picks it and publishes it in the store
    (under a generation counted by joins, so that a group made again after a
    destroy does not read its predecessor's id), the others wait for it."""
    from .control import new_session_id

    generation = (store.add(_JOINS_KEY, 1) - 1) // size
    key = f"switchml/session/{generation}"
    if rank == 0:
        sid = new_session_id()
        store.set(key, str(sid))
        return sid
    return int(store.get(key).decode())


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> SwitchMLProcessGroup:
    """The creator torch.distributed calls for ``backend="switchml"``."""
    return SwitchMLProcessGroup(store, rank, size, timeout)


#: groups not yet destroyed: their jobs are released at interpreter exit
_live: weakref.WeakSet[SwitchMLProcessGroup] = weakref.WeakSet()


@atexit.register
def _release_at_exit() -> None:
    """A program that never called ``destroy_process_group`` still leaves its
    jobs (the switch side only: gloo is torch's to tear down)."""
    for pg in list(_live):
        try:
            pg._stop()
        except Exception:  # best effort at exit
            pass


def register() -> None:
    """Register the ``switchml`` backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu"])
