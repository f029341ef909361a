"""A data-plane shard of the sharded emulator: the child process.

:func:`shard_main` runs in each shard (multiprocessing's ``spawn`` context): its
own event loop, engine and :class:`~swemu.serving.dataplane.DataPlane` on its
socket, answering the main process's table writes and snapshot requests over
its pipe. Also the checks and socket binding the main process does before it
starts the shards. The whole design: :mod:`swemu.serving.shards`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import signal
import socket
from typing import TYPE_CHECKING, Any

from swemu.core.controller import DropSimulation

if TYPE_CHECKING:
    from swemu.core.engine import EngineConfig
    from swemu.core.faults import FaultConfig

log = logging.getLogger("swemu.shards")

#: The most data-plane processes: the 16 ports 0xBEE0-0xBEEF a switch matches.
MAX_SHARDS = 16
#: The SwitchML port range (docs/protocol.md §1); shards starting in it stay in it.
SWITCHML_PORTS = range(0xBEE0, 0xBEF0)


class ShardError(RuntimeError):
    """A data-plane shard failed a request, did not answer, or is gone."""


def check_shards(port: int, shards: int) -> None:
    """Raise ValueError (saying why) unless ``shards`` processes fit from ``port``.

    1..16 shards; ports P..P+S-1 must exist, and when P is a SwitchML port
    (0xBEE0-0xBEEF, the default 48864 included) they must all be SwitchML
    ports: a switch matches ``port & 0xFFF0 == 0xBEE0``.
    """
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"--shards {shards} must be in 1..{MAX_SHARDS}")
    if port == 0:
        return
    last = port + shards - 1
    if port in SWITCHML_PORTS and last not in SWITCHML_PORTS:
        raise ValueError(
            f"--shards {shards} from --port {port} needs ports up to {last}, past the "
            f"SwitchML range {SWITCHML_PORTS.start}-{SWITCHML_PORTS.stop - 1}"
        )
    if last > 0xFFFF:
        raise ValueError(f"--shards {shards} from --port {port} needs port {last} (> 65535)")


def bind_shard_sockets(host: str, port: int, count: int, attempts: int = 64) -> list[socket.socket]:
    """``count`` UDP sockets on ports ``port .. port+count-1`` (port 0: any
    consecutive free ones). OSError names the port that cannot be bound."""
    from swemu.serving.dataplane import bind_udp

    if port != 0:
        socks: list[socket.socket] = []
        try:
            for i in range(count):
                socks.append(bind_udp(host, port + i))
        except OSError:
            for s in socks:
                s.close()
            raise
        return socks
    for _ in range(attempts):
        socks = [bind_udp(host, 0)]
        first = socks[0].getsockname()[1]
        try:
            if first + count - 1 > 0xFFFF:
                raise OSError("no room above")
            for i in range(1, count):
                socks.append(bind_udp(host, first + i))
        except OSError:
            for s in socks:
                s.close()
            continue
        return socks
    raise OSError(f"cannot find {count} consecutive free UDP ports on {host}")


# ----------------------------------------------------------------------------- shard side
class _Shard:
    """One data-plane process: an engine holding slots ``s % count == index``, a
    data plane on its socket, and the requests of the main process."""

    def __init__(
        self,
        index: int,
        count: int,
        sock: socket.socket,
        conn: Any,
        config: EngineConfig,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        from swemu.core.engine import EmulatorTarget, SwitchEngine
        from swemu.serving.dataplane import DataPlane

        self.index = index
        self.sock = sock
        self.conn = conn
        self.loop = loop
        self.engine = SwitchEngine(config, shard=(index, count))
        self.target = EmulatorTarget(self.engine)
        self.data = DataPlane(self.engine, sock, loop)
        self.done = asyncio.Event()

    def on_readable(self) -> None:
        try:
            while self.conn.poll():
                seq, op, args = self.conn.recv()
                try:
                    value = getattr(self, f"op_{op}")(*args)
                except Exception as exc:  # reported to the main process, which decides
                    log.exception("shard %d: %s failed", self.index, op)
                    self.conn.send((seq, False, f"{type(exc).__name__}: {exc}"))
                else:
                    self.conn.send((seq, True, value))
        except (EOFError, OSError):  # the main process is gone: nobody to serve
            self.done.set()

    # requests (op_<name>), in the order the main process sent them
    def op_create_job(
        self, session_id: int, workers: int, code: int, pool: int, formats: int = 0
    ) -> None:
        self.data.flush()  # what arrived before counts under the tables before (a resume)
        self.engine.create_job(session_id, workers, code, pool, self.loop.time(), formats)

    def op_delete_job(self, session_id: int, why: str) -> None:
        job = self.engine.jobs.get(session_id)
        if job is not None:
            self.engine.drop_job(job, why)

    def op_set_worker(self, session_id: int, rank: int, ip: int, port: int, mac: int) -> None:
        job = self.engine.jobs[session_id]
        self.engine.set_worker(job, rank, ip, port, mac)
        self.engine.touch(job, self.loop.time())  # registering is activity (idle timer)

    def op_remove_worker(self, session_id: int, rank: int) -> None:
        self.engine.remove_worker(self.engine.jobs[session_id], rank)

    def op_drops(self, ingress: float, egress: float) -> None:
        self.target.set_drop_simulation(DropSimulation(ingress, egress))

    def op_faults(
        self, config: FaultConfig, session_id: int, rank: int | None, seed: int | None
    ) -> None:
        from swemu.serving.fault_control import configure

        configure(self.engine, self.data, config, session_id=session_id, rank=rank, seed=seed)

    def op_idle(self) -> dict[int, float]:
        """Seconds since each job's last packet (or registration) in this shard."""
        now = self.loop.time()
        return {
            sid: now - float(self.engine.job_last_seen[job.index])
            for sid, job in self.engine.jobs.items()
        }

    def op_snapshot(self) -> dict[str, Any]:
        snap = self.engine.snapshot()
        now = self.loop.time()
        for job in snap["jobs"]:
            job["idle"] = now - job.pop("last_seen")  # clocks differ between processes
        snap["data_plane"] = {k: int(v) for k, v in dataclasses.asdict(self.data.stats).items()}
        return snap

    def op_stop(self) -> None:
        self.done.set()


async def _shard_serve(
    index: int,
    count: int,
    sock: socket.socket,
    conn: Any,
    config: EngineConfig,
    faults: FaultConfig | None,
    seed: int | None,
) -> None:
    from swemu.protocol.jit import compiling_said

    loop = asyncio.get_running_loop()
    try:
        with compiling_said(log):  # the data plane compiles what it serves as it starts
            shard = _Shard(index, count, sock, conn, config, loop)
            if faults is not None:
                shard.op_faults(faults, 0, None, seed)
            shard.data.start()
    except Exception as exc:  # said once, by the main process: no traceback here
        conn.send((0, False, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    loop.add_reader(conn.fileno(), shard.on_readable)
    conn.send((0, True, {"pid": multiprocessing.current_process().pid}))
    try:
        await shard.done.wait()
    finally:
        loop.remove_reader(conn.fileno())
        shard.data.stop()
        sock.close()


def shard_main(
    index: int,
    count: int,
    sock: socket.socket,
    conn: Any,
    config: EngineConfig,
    faults: FaultConfig | None = None,
    seed: int | None = None,
    log_level: str = "info",
) -> None:
    """The entry point of shard ``index`` of ``count`` (a spawned process).

    Serves ``sock`` until the main process sends ``stop`` or goes away. Fault
    injection uses ``seed + index``, so that shards are not in lockstep.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when to stop
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s %(name)s[shard {index}] %(levelname)s %(message)s",
    )
    shard_seed = None if seed is None else seed + index
    coro = _shard_serve(index, count, sock, conn, config, faults, shard_seed)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)
