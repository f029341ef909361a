"""The worker side of SwitchML as a sans-IO state machine (docs/protocol.md §3–§4).

Theory of operation
-------------------
A :class:`WorkerProtocol` is one worker's membership of one job. It owns what
outlives a single allreduce: the window size K (the job's pool size), the next
shadow set of every slot (the parity continues across calls) and the count of
calls (job_number = calls mod 256).

:meth:`WorkerProtocol.allreduce` returns an :class:`Allreduce`, the state of one
call. It never touches a socket or the clock; its caller (``hostlib.client`` or
an in-memory test fabric) drives it::

    op = proto.allreduce(x, out, now)
    send(op.packets(op.initial()))                  # the first window
    on datagrams: n = op.receive(buf, lens, ok, k, now); send(op.packets(n))
    at op.get_timer(): n = op.handle_timer(now); send(op.packets(n))
    until op.done; op.check(now) raises NoProgressError when nothing moves

Each slot s carries chunks s, s+K, s+2K, ...: the result of one is the signal
to send the next on the same slot with the other set. float32 calls first send
one exponent-only packet per slot (tsi = 2^31 + s), whose result is the shared
exponent of chunk s; every data packet then carries the exponent of the chunk
K ahead (§4). The kernels in :mod:`swemu.protocol.worker.kernels` do all of it in batches.

float16 and bfloat16 tensors are floating calls too, read and written in their
own type (no float32 copy); a floating call with ``values16`` sends 16-bit values,
twice as many per packet, with the format bit set (§4.2): the job must have
registered that format (``ValueFormats.INT32_AND_BLOCK16``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swemu.protocol import wire

from . import block16
from . import kernels as K
from .errors import NoProgressError
from .recovery import Progress, RecoveryError, SlotResult

SUPPORTED_DTYPES = (np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float16))
#: numpy has no bfloat16; ml_dtypes' (what TensorFlow and JAX hand out) is known by name
BFLOAT16 = "bfloat16"
#: Allreduce.dtype: the element type of a call's tensor
DTYPE_NAMES = ("int32", "float32", "float16", BFLOAT16)
HALF_DTYPES = ("float16", BFLOAT16)  # the 16-bit ones


@dataclass(frozen=True)
class Timing:
    """Retransmission and failure-detection settings (seconds).

    ``timeout`` is the first packets' timeout and the floor of the adaptive one:
    once results arrive, a new packet waits ``srtt + 4·rttvar`` (RFC 6298
    smoothing, no samples from retransmitted packets), so that a machine shared
    with the emulator does not resend results that are merely late. The learned
    timeout carries over to the next call's first window. A duplicate result
    (the switch answered a resend of a packet whose result had come) proves a
    timeout spurious and raises the floor to twice the timeout in use, at most
    once per timeout; the raised floor decays back towards ``timeout`` over
    about 8000 samples. A slot that times out ``backoff_after`` times in a row
    doubles its timeout, up to
    ``max_timeout``. An allreduce fails when no result at all arrived for
    ``no_progress``. (p4app-switchML: fixed 10 ms, doubling after 100 timeouts.)

    ``reorder_guard`` is the longest time the network may hold a packet back
    behind later ones. §2 is exactly-once on FIFO links (a star of links to one
    switch is one); if copies of a packet can arrive late, a late copy of a
    slot's previous packet could reach the switch after the slot's next one, and
    the switch would take it for a new contribution. So a slot's next packet
    (also in the next call) waits until ``reorder_guard`` has passed since the
    slot's last transmission. 0 (the default) trusts the links to keep order.
    """

    timeout: float = 0.02
    backoff_after: int = 3
    max_timeout: float = 0.5
    no_progress: float = 10.0
    reorder_guard: float = 0.0

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.max_timeout < self.timeout or self.no_progress <= 0:
            raise ValueError("need 0 < timeout <= max_timeout and no_progress > 0")
        if self.reorder_guard < 0:
            raise ValueError("reorder_guard must not be negative")
        if self.backoff_after < 1:
            raise ValueError("backoff_after must be at least 1")


def dtype_name(x: np.ndarray, bfloat16: bool = False) -> str:
    """The element type of an allreduce's array (one of :data:`DTYPE_NAMES`):
    ``bfloat16`` says a uint16/int16 array holds bfloat16 bit patterns (a torch
    bfloat16 tensor's memory, say); an ml_dtypes bfloat16 array is one by name."""
    if bfloat16:
        if x.dtype.itemsize != 2 or x.dtype.kind not in "uifV":
            raise TypeError(f"bfloat16=True needs 16-bit patterns, got {x.dtype}")
        return BFLOAT16
    if x.dtype.name == BFLOAT16 and x.dtype.itemsize == 2:
        return BFLOAT16
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"allreduce supports int32, float32, float16 and bfloat16 arrays, got {x.dtype}"
        )
    return x.dtype.name


def check_input(
    x: np.ndarray, out: np.ndarray | None, *, bfloat16: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Validate an allreduce's arrays; return flat C-contiguous views (in, out):
    float16 and bfloat16 arrays as uint16 views of their bit patterns."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"allreduce takes a numpy array, got {type(x).__name__}")
    half = dtype_name(x, bfloat16) in HALF_DTYPES
    if not x.flags.c_contiguous:
        raise ValueError("allreduce needs a C-contiguous array (use np.ascontiguousarray)")
    if out is None:
        out = np.empty_like(x)
    else:
        if not isinstance(out, np.ndarray) or out.dtype != x.dtype or out.shape != x.shape:
            raise ValueError("out must be a numpy array of the same dtype and shape as x")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writeable")
    if half:
        return x.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint16)
    return x.reshape(-1), out.reshape(-1)


class WorkerProtocol:
    """One worker's state in one job: window, set parity, call count."""

    def __init__(
        self,
        *,
        num_workers: int,
        size_code: int = 3,
        window: int = 128,
        timing: Timing | None = None,
    ) -> None:
        if not 1 <= num_workers <= wire.MAX_WORKERS:
            raise ValueError(f"num_workers must be in 1..{wire.MAX_WORKERS}")
        if not 1 <= window <= wire.MAX_SLOTS:
            raise ValueError(f"window must be in 1..{wire.MAX_SLOTS}")
        self.num_workers = num_workers
        self.size_code = wire.SizeCode(size_code)
        self.nvals = wire.values_per_packet(size_code)
        self.window = window
        self.timing = timing or Timing()
        self.next_set = np.zeros(window, np.uint8)
        self.calls = 0
        self.rows = np.zeros((window, wire.packet_len(size_code)), np.uint8)
        self.rtt = np.zeros(len(K.Rtt), np.float64)  # the timer's learned state
        self.quiet = np.zeros(window, np.float64)  # per slot: last transmission + reorder guard
        # restart recovery (docs/protocol.md §5): results accepted per slot, and the
        # last result of each slot whose last result came in a finished call
        self.rounds = np.zeros(window, np.int64)
        self.retained: dict[int, SlotResult] = {}

    def allreduce(
        self,
        x: np.ndarray,
        out: np.ndarray | None,
        now: float,
        *,
        values16: bool = False,
        bfloat16: bool = False,
    ) -> Allreduce:
        """Start one allreduce of ``x`` (validated here) into ``out``; ``values16``
        sends a floating tensor as 16-bit values (docs/protocol.md §4.2; the job
        must have registered the format), ``bfloat16`` says ``x`` (uint16 or
        int16) holds bfloat16 bit patterns."""
        dtype = dtype_name(x, bfloat16)
        if values16 and dtype == "int32":
            raise TypeError("int32 sums are exact on the 32-bit wire only; values16 is for floats")
        flat_x, flat_out = check_input(x, out, bfloat16=bfloat16)
        op = Allreduce(
            self, flat_x, flat_out, self.calls % 256, now, dtype=dtype, values16=values16
        )
        self.calls += 1
        return op

    def retain(self, op: Allreduce) -> None:
        """Keep a copy of the last result of each slot of the finished call
        ``op``, before its output goes back to the caller: a rank whose copy of
        one of them is lost in a switch restart gets it from here (restart
        recovery). A window of chunks, copied once per call."""
        self.retained.update(op.last_results())

    def progress(self, op: Allreduce | None = None) -> Progress:
        """What this worker reports when it resumes after a switch restart: its
        results per slot and its last result of each slot (``op``: the call in
        progress, if any)."""
        last = dict(self.retained)
        if op is not None:
            last.update(op.last_results())
        return Progress(tuple(int(r) for r in self.rounds), last)


class Allreduce:
    """The state of one allreduce call (see the module docstring)."""

    def __init__(
        self,
        proto: WorkerProtocol,
        x: np.ndarray,
        out: np.ndarray,
        job_number: int,
        now: float,
        *,
        dtype: str | None = None,
        values16: bool = False,
    ) -> None:
        self.proto = proto
        self.job_number = job_number
        #: the tensor's element type (DTYPE_NAMES); 16-bit ones come as uint16 views
        self.dtype = dtype or x.dtype.name
        self.half = {"float16": block16.HALF_FLOAT16, BFLOAT16: block16.HALF_BFLOAT16}.get(
            self.dtype, block16.HALF_NONE
        )
        self.is_float = self.dtype != "int32"
        self.values16 = bool(values16)
        self.out = out  # the result, flat (16-bit tensors: their bit patterns)
        self.size = x.shape[0]
        nv = proto.nvals * (2 if self.values16 else 1)  # values per packet
        self.nvals = nv
        self.nchunks = (self.size + nv - 1) // nv
        k = proto.window
        self.chunk = np.full(k, K.DONE, np.int64)
        self.cur_set = np.zeros(k, np.uint8)
        self.deadline = np.zeros(k, np.float64)
        self.rto = np.zeros(k, np.float64)
        self.tries = np.zeros(k, np.int32)
        self.send = np.zeros(k, np.int32)
        self.waiting = np.zeros(k, np.uint8)
        self.counters = np.zeros(len(K.Counter), np.int64)
        self.my_exp = np.zeros(self.nchunks if self.is_float else 0, np.int8)
        self.shared_exp = np.zeros_like(self.my_exp)
        # the kernels take every typed view; the unused ones are empty
        empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
        empty_h = np.zeros(0, np.uint16)
        self.xi, self.xf, self.oi, self.of = empty_i, empty_f, empty_i, empty_f
        self.xh, self.oh = empty_h, empty_h
        if self.half != block16.HALF_NONE:
            self.xh, self.oh = x, out
        elif self.is_float:
            self.xf, self.of = x, out
        else:
            self.xi, self.oi = x, out
        if self.values16:
            self.limit = float(block16.offset16(proto.num_workers))
        else:
            self.limit = float(K.INT32_MAX // proto.num_workers)
        self.expected_results = self.nchunks + (min(k, self.nchunks) if self.is_float else 0)
        self.last_progress = now
        #: how long the call waits without a result (:meth:`check`): the session's
        #: ``Timing.no_progress``; a client may allow a call more (hostlib.client)
        self.no_progress = float(proto.timing.no_progress)
        self._started = False
        t = proto.timing
        #: whether the call has 16-bit data (a 16-bit wire or tensor): its state
        #: then carries the 16-bit arrays, and the kernels run their 16-bit version
        #: (a 32-bit call's state has None there, a type that compiles no 16-bit code)
        self.has16 = self.values16 or self.half != block16.HALF_NONE
        #: the call as the kernels take it (:class:`swemu.protocol.worker.kernels.WorkerState`)
        self.state = K.WorkerState(
            xi=self.xi,
            xf=self.xf,
            oi=self.oi,
            of=self.of,
            is_float=bool(self.is_float),
            my_exp=self.my_exp,
            shared_exp=self.shared_exp,
            limit=self.limit,
            xh=self.xh if self.has16 else None,
            oh=self.oh if self.has16 else None,
            half=int(self.half),
            wire16=self.values16,
            nchunks=int(self.nchunks),
            nvals=int(nv),
            nslots=int(k),
            num_workers=int(proto.num_workers),
            code=int(proto.size_code),
            job_number=int(job_number),
            rows=proto.rows,
            chunk=self.chunk,
            cur_set=self.cur_set,
            next_set=proto.next_set,
            deadline=self.deadline,
            rto=self.rto,
            tries=self.tries,
            quiet=proto.quiet,
            rounds=proto.rounds,
            waiting=self.waiting,
            send=self.send,
            rto_min=float(t.timeout),
            rto_max=float(t.max_timeout),
            guard=float(t.reorder_guard),
            rtt=proto.rtt,
            counters=self.counters,
        )
        if self.half != block16.HALF_NONE:
            status = block16.half_exponents(x, nv, self.my_exp, int(self.half))
        elif self.is_float:
            status = K.chunk_exponents(x, nv, self.my_exp)
        if self.is_float:
            if status == 1:
                raise ValueError(f"{self.dtype} input contains NaN or Inf; SwitchML cannot sum it")
            if status == 2:
                raise ValueError(
                    "float32 input has |x| >= 2^127, beyond the int8 exponent of block "
                    "floating point; scale it down before the allreduce"
                )

    @property
    def done(self) -> bool:
        """Every result is in: one per chunk, plus one exponent result per slot used
        (float32). Each accepted result advances its slot once, so the count decides."""
        return self.nchunks == 0 or int(self.counters[K.Counter.RESULTS]) == self.expected_results

    def initial(self, now: float) -> int:
        """Build the first window; return the count of slots in :attr:`send` to send."""
        if self.nchunks == 0:
            return 0
        n = K.start(now, self.state)
        self._started = True
        self.counters[K.Counter.SENT] += n
        return n

    def receive(self, buf: np.ndarray, lens: np.ndarray, ok: np.ndarray, n: int, now: float) -> int:
        """Feed ``n`` received datagrams (rows of ``buf``); ``ok[r]`` says it came
        from the switch. Returns the count of slots in :attr:`send` to send."""
        before = self.counters[K.Counter.RESULTS]
        addrs = buf.ctypes.data + buf.strides[0] * np.arange(n, dtype=np.int64)
        m = K.on_results(addrs, lens, ok, n, now, self.state)
        if self.counters[K.Counter.RESULTS] != before:
            self.last_progress = now
        self.counters[K.Counter.SENT] += m
        return m

    def get_timer(self) -> float:
        """When :meth:`handle_timer` should next run (inf when done)."""
        return float(K.next_deadline(self.chunk, self.deadline))

    def handle_timer(self, now: float) -> int:
        """Retransmit expired slots; return the count of slots in :attr:`send`."""
        m = K.on_timer(now, self.state, int(self.proto.timing.backoff_after))
        self.counters[K.Counter.SENT] += m
        return m

    def check(self, now: float, where: str = "the switch") -> None:
        """Raise :class:`NoProgressError` if no result arrived for too long."""
        limit = self.no_progress
        if self.done or now - self.last_progress < limit:
            return
        active = np.flatnonzero(self.chunk != K.DONE)
        oldest = int(active[np.argmin(self.chunk[active])])
        c = int(self.chunk[oldest])
        what = "the exponent packet" if c == -1 else f"chunk {c}"
        got = int(self.counters[K.Counter.RESULTS])
        if got == 0:  # not a slot count: slots without a chunk count as finished from the start
            tail = (
                f"not one result of this call has arrived ({int(self.counters[K.Counter.SENT])} "
                "packets sent): the switch may be unreachable or not running, or no other "
                "worker is sending."
            )
        else:
            tail = (
                f"{got} of {self.expected_results} results had arrived. A peer may have died "
                "or stalled, or the switch became unreachable."
            )
        raise NoProgressError(
            f"allreduce #{self.proto.calls - 1} (job_number {self.job_number}): no result for "
            f"{what} on slot {oldest} (set {int(self.cur_set[oldest])}) from {where} for "
            f"{now - self.last_progress:.1f} s after {int(self.tries[oldest])} retransmissions; "
            + tail,
            chunk=c,
            slot=oldest,
        )

    def _output(self) -> np.ndarray:
        """The call's output as the kernels store it: int32, float32, or a 16-bit
        tensor's bit patterns (uint16)."""
        if self.half != block16.HALF_NONE:
            return self.oh
        return self.of if self.is_float else self.oi

    def last_results(self) -> dict[int, SlotResult]:
        """The last result of each slot that has had one in this call (its
        chunk's output copied out; an exponent packet's result without values)."""
        proto, k, nv = self.proto, self.proto.window, self.nvals
        out = self._output()
        found: dict[int, SlotResult] = {}
        for s in range(min(k, self.nchunks)):
            c = int(self.chunk[s])
            if c == -1:
                continue  # waiting for its exponent packet: nothing yet in this call
            if c == K.DONE:
                prev = s + k * ((self.nchunks - 1 - s) // k)  # the slot's last chunk
                st = int(self.cur_set[s])
            else:
                prev = c - k
                st = 1 - int(self.cur_set[s])
            if prev < 0 and not self.is_float:
                continue  # the slot's first chunk is outstanding
            if prev < 0:  # the result of the slot's exponent packet
                tsi, e0, values = wire.EXP_TSI_BASE + s, int(self.shared_exp[s]), b""
            else:
                tsi, values = prev, out[prev * nv : min((prev + 1) * nv, self.size)].tobytes()
                e0 = 0
                if self.is_float:
                    ahead = prev + k
                    e0 = int(self.shared_exp[ahead]) if ahead < self.nchunks else wire.EXP_NONE
            found[s] = SlotResult(s, int(proto.rounds[s]), tsi, st, self.job_number, e0, values)
        return found

    def apply_repairs(self, repairs: list[SlotResult], now: float) -> int:
        """After a switch restart: take the results this worker lacks from the
        ranks that hold them (the ``Resume`` reply), then queue every packet
        still outstanding to be sent again, to a switch whose slots are fresh.
        Returns the count of slots in :attr:`send`. Raises RecoveryError for a
        repair that is not the result of this worker's outstanding packet."""
        proto = self.proto
        out = self._output()
        empty_i, empty_f, empty_h = self.oi[:0], self.of[:0], self.oh[:0]
        queued: list[int] = []
        for r in repairs:
            s = r.slot
            c = int(self.chunk[s]) if 0 <= s < proto.window else K.DONE
            expect = wire.EXP_TSI_BASE + s if c == -1 else c
            if (
                c == K.DONE
                or self.waiting[s]
                or r.tsi != expect
                or r.set != int(self.cur_set[s])
                or r.job_number != self.job_number
                or r.round != int(proto.rounds[s]) + 1
            ):
                raise RecoveryError(
                    f"a repair of slot {s} (tsi {r.tsi}, round {r.round}) is not the result "
                    f"this worker waits for there"
                )
            values = np.frombuffer(r.values, out.dtype) if c >= 0 else out[:0]
            if c >= 0 and values.shape[0] != min(self.nvals, self.size - c * self.nvals):
                raise RecoveryError(f"a repair of slot {s} has {values.shape[0]} values")
            vi, vf, vh = empty_i, empty_f, empty_h
            if self.half != block16.HALF_NONE:
                vh = values
            elif self.is_float:
                vf = values
            else:
                vi = values
            if K.apply_result(s, int(r.e0), vi, vf, vh, now, self.state):
                queued.append(int(self.send[0]))
        self.last_progress = now
        again = np.flatnonzero((self.chunk != K.DONE) & (self.waiting == 0))
        for s in again.tolist():
            if s not in queued:
                queued.append(s)
                self.tries[s] += 1  # a resend: no RTT sample from its result (Karn)
                self.deadline[s] = now + self.rto[s]
        self.send[: len(queued)] = queued
        self.counters[K.Counter.SENT] += len(queued)
        return len(queued)

    def packets(self, n: int) -> list[memoryview]:
        """The datagrams of the first ``n`` slots in :attr:`send` (views of the rows)."""
        rows = self.proto.rows
        return [memoryview(rows[s]) for s in self.send[:n].tolist()]


#: the warm-up calls: (dtype, on the 16-bit wire); one compiled version of the
#: kernels serves every 32-bit call, another every call with 16-bit data
WARMUP32 = ((np.int32, False), (np.float32, False))
WARMUP16 = ((np.float16, True),)


def warmup() -> None:
    """Compile (or load from Numba's cache) every kernel of the worker's data
    path for 32-bit calls (int32 and float32), each run once to check it,
    before any clock starts: a first allreduce must not spend its no-progress
    budget compiling. A float32 or int32 job leaves the 16-bit version
    uncompiled (``kernels``: the state's type chooses the version;
    :func:`warmup16` compiles it)."""
    warmup_calls(WARMUP32)


def warmup16() -> None:
    """:func:`warmup` of the kernels' version for calls with 16-bit data only
    (float16 on the 16-bit wire: the same version serves float16 and bfloat16
    on either wire, and float32 on the 16-bit wire)."""
    warmup_calls(WARMUP16)


def warmup_call(dtype: type, wire16: bool) -> tuple[WorkerProtocol, Allreduce]:
    """A small call of ``dtype`` (on the 16-bit wire with ``wire16``) on a
    one-worker, one-slot protocol: what the warm-ups run through the kernels."""
    proto = WorkerProtocol(num_workers=1, size_code=0, window=1)
    return proto, proto.allreduce(np.ones(40, dtype), None, 0.0, values16=wire16)


def warmup_calls(calls: tuple[tuple[type, bool], ...]) -> None:
    """Run a small call of each ``(dtype, values16)`` through the kernels."""
    for dtype, wire16 in calls:
        proto, op = warmup_call(dtype, wire16)
        for _ in range(3):  # exponent packet (float32), then two data chunks
            n = op.initial(0.0) if not op._started else op.handle_timer(op.get_timer())
            if op.done or n == 0:
                break
            row = proto.rows[:1].copy()
            op.receive(row, np.array([row.shape[1]], np.int32), np.ones(1, np.uint8), 1, 0.0)
