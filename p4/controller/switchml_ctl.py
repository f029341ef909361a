"""The SwitchML controller for a Tofino running p4/switchml.p4.

Serves docs/protocol.md §5's gRPC API (``Session.UdpSession``, ``Sync.Barrier``,
``Sync.Broadcast``) with the emulator's own services, over a
:class:`swemu.core.controller.SessionController` that writes the switch's tables
through BF Runtime (:class:`p4.controller.TofinoTarget`). Workers use it
exactly as they use ``switchml-emu serve``::

    python p4/controller/switchml_ctl.py --bfrt-addr 127.0.0.1:50052 \\
        --switch-ip 10.0.0.254 --switch-mac 02:00:00:00:00:fe --control-port 50099 \\
        --worker 10.0.0.1=0/b8:ce:f6:00:00:01 --worker 10.0.0.2=4/b8:ce:f6:00:00:02

``--target emulator`` is a dry run that needs no switch: the same controller,
with the hardware's limits, drives a Tofino target whose BF Runtime client is
an in-memory recorder (every table write is printed on stdout) and an
emulator behind it, whose UDP data plane on ``--switch-ip:--data-port``
aggregates for real -- so hostlib can run against it unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from p4.controller.bfrt_target import NUM_POOL_SLOTS, TofinoJob, TofinoTarget, WorkerPort
from p4.controller.recording_bfrt import RecordingBfrt, format_write
from swemu.core.controller import (
    DropSimulation,
    JobParams,
    RegistrationError,
    SessionController,
    SwitchAddress,
    TargetLimits,
    WorkerAddress,
)
from swemu.protocol import wire

if TYPE_CHECKING:  # the engine (numpy, Numba) only in the emulator mode
    from swemu.core.engine import EmulatorTarget

log = logging.getLogger("switchml_ctl")

#: the Tofino program takes any UDP port 0xBEE0-0xBEEF; workers are told this one
DEFAULT_DATA_PORT = wire.DEFAULT_UDP_PORT


class ControllerError(RuntimeError):
    """A setup problem reported as one line (no BF Runtime, ...)."""


# ----------------------------------------------------------------------------- dry run
class DryRunTarget:
    """A Tofino target (its limits, its room, its table writes) in front of an
    emulator target (a real data plane): every write goes to both, so what the
    switch would hold is printed and what it would do can be tried.

    The emulator of a dry run has no idle timer, so no job is ever released
    behind the controller's back.
    """

    def __init__(self, hardware: TofinoTarget, emulator: EmulatorTarget) -> None:
        self.hardware = hardware
        self.emulator = emulator

    @property
    def limits(self) -> TargetLimits:
        return self.hardware.limits

    def set_switch_address(self, address: SwitchAddress) -> None:
        self.hardware.set_switch_address(address)
        self.emulator.set_switch_address(address)

    def room_for_job(self, job: JobParams, replacing: Any | None) -> RegistrationError | None:
        hw, emu = replacing if replacing is not None else (None, None)
        return self.hardware.room_for_job(job, hw) or self.emulator.room_for_job(job, emu)

    def check_worker(self, worker: WorkerAddress) -> RegistrationError | None:
        return self.hardware.check_worker(worker)

    def create_job(self, job: JobParams, *, now: float) -> tuple[TofinoJob, Any]:
        return (self.hardware.create_job(job, now=now), self.emulator.create_job(job, now=now))

    def delete_job(self, handle: tuple[TofinoJob, Any], *, why: str) -> None:
        self.hardware.delete_job(handle[0], why=why)
        self.emulator.delete_job(handle[1], why=why)

    def set_worker(
        self, handle: tuple[TofinoJob, Any], rank: int, worker: WorkerAddress, *, now: float
    ) -> None:
        self.hardware.set_worker(handle[0], rank, worker, now=now)
        # the emulator addresses results by IP and port; the MAC is the hardware's choice
        self.emulator.set_worker(handle[1], rank, handle[0].workers[rank], now=now)

    def remove_worker(self, handle: tuple[TofinoJob, Any], rank: int) -> None:
        self.hardware.remove_worker(handle[0], rank)
        self.emulator.remove_worker(handle[1], rank)

    def broadcast_port(self, handle: tuple[TofinoJob, Any]) -> int:
        return self.hardware.broadcast_port(handle[0])  # what the switch would answer

    def set_drop_simulation(self, drops: DropSimulation) -> None:
        self.hardware.set_drop_simulation(drops)
        self.emulator.set_drop_simulation(drops)

    def watch_releases(self, callback: Any) -> None:
        """Neither side frees jobs by itself in a dry run."""

    def read_state(self) -> dict[str, Any]:
        """What the switch would hold (the emulator's is ``self.emulator.read_state()``)."""
        return self.hardware.read_state()


# ----------------------------------------------------------------------------- options
def parse_mac(text: str) -> int:
    parts = text.split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise argparse.ArgumentTypeError(f"not a MAC address: {text!r}")
    try:
        return int("".join(parts), 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a MAC address: {text!r}") from None


def parse_port(text: str) -> WorkerPort:
    """``DEV_PORT`` or ``DEV_PORT/MAC``."""
    port, _, mac = text.partition("/")
    try:
        dev_port = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a device port: {port!r}") from None
    if not 0 <= dev_port < 512:
        raise argparse.ArgumentTypeError(f"device port {dev_port} is not in 0..511")
    return WorkerPort(dev_port, parse_mac(mac) if mac else None)


def parse_worker(text: str) -> tuple[int, WorkerPort]:
    """``IP=DEV_PORT[/MAC]``."""
    ip, sep, rest = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected IP=DEV_PORT[/MAC], got {text!r}")
    try:
        address = int(ipaddress.IPv4Address(ip))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 address: {ip!r}") from None
    return address, parse_port(rest)


def parse_probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a probability is in [0, 1], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="switchml_ctl.py",
        description="SwitchML controller for p4/switchml.p4 (docs/protocol.md §5 gRPC API)",
    )
    p.add_argument(
        "--target",
        choices=("tofino", "emulator"),
        default="tofino",
        help="tofino: program a switch over BF Runtime; emulator: dry run (prints the writes)",
    )
    p.add_argument("--bfrt-addr", default="127.0.0.1:50052", help="BF Runtime gRPC server")
    p.add_argument("--program", default="switchml", help="P4 program name given to bf-p4c")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--switch-ip", required=True, help="the switch's IPv4 address for workers")
    p.add_argument("--switch-mac", type=parse_mac, default=wire.DEFAULT_SWITCH_MAC)
    p.add_argument("--control-host", default="0.0.0.0", help="where the gRPC API listens")
    p.add_argument("--control-port", type=int, default=50099, help="gRPC port (0: any)")
    p.add_argument(
        "--data-port",
        type=int,
        default=DEFAULT_DATA_PORT,
        help="dry run only: the emulator's UDP port on --switch-ip (0: any)",
    )
    p.add_argument(
        "--worker",
        type=parse_worker,
        action="append",
        default=[],
        metavar="IP=DEV_PORT[/MAC]",
        help="a worker host's device port (and MAC, if its UdpSession sends none); repeat",
    )
    p.add_argument(
        "--default-port",
        type=parse_port,
        metavar="DEV_PORT[/MAC]",
        help="the device port of workers not given with --worker",
    )
    p.add_argument(
        "--pool-size",
        type=int,
        default=1024,
        help=f"slots of a job whose UdpSession asks for 0 (at most {NUM_POOL_SLOTS})",
    )
    p.add_argument("--ingress-drop", type=parse_probability, default=0.0)
    p.add_argument("--egress-drop", type=parse_probability, default=0.0)
    p.add_argument("--ready-file", help="write the bound addresses here (JSON) once serving")
    p.add_argument("--log-level", default="info")
    return p


# ----------------------------------------------------------------------------- serving
class Controller:
    """The running controller: target, gRPC services, and in a dry run the data plane."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.target: TofinoTarget | DryRunTarget | None = None
        self.controller: SessionController | None = None
        self.grpc: Any = None
        self.control_port = 0
        self.data_port = 0
        self._sock: Any = None
        self._data: Any = None
        self._sync: Any = None

    def _tofino(self, bfrt: RecordingBfrt | None) -> TofinoTarget:
        a = self.args
        options = {
            "ports": dict(a.worker),
            "default_port": a.default_port,
            "default_pool_size": a.pool_size,
        }
        if bfrt is None:
            try:
                return TofinoTarget.connect(
                    a.bfrt_addr, program=a.program, device_id=a.device_id, **options
                )
            except ImportError as exc:
                raise ControllerError(
                    f"cannot use BF Runtime ({exc}): run this with the SDE's Python "
                    "(source $SDE/set_sde.bash), or try --target emulator for a dry run"
                ) from None
        return TofinoTarget(bfrt.bfrt_info, bfrt.gc, bfrt.device, **options)

    async def start(self) -> None:
        from swemu.serving.control_plane import SessionService, SyncService, start_control_server

        a = self.args
        loop = asyncio.get_running_loop()
        switch_ip = int(ipaddress.IPv4Address(a.switch_ip))
        # workers learn the data port from the controller (docs/protocol.md §5
        # data_ports), so a control address alone is enough to join
        data_ports: tuple[int, ...] = (DEFAULT_DATA_PORT,)
        if a.target == "tofino":
            self.target = self._tofino(None)
        else:
            from swemu.core.engine import EmulatorTarget, EngineConfig, SwitchEngine
            from swemu.serving.dataplane import DataPlane, bind_udp

            bfrt = RecordingBfrt(on_write=lambda w: print(format_write(w), flush=True))
            engine = SwitchEngine(EngineConfig(pool_size=NUM_POOL_SLOTS))
            self.target = DryRunTarget(self._tofino(bfrt), EmulatorTarget(engine))
            self._sock = bind_udp(a.switch_ip, a.data_port)
            self.data_port = self._sock.getsockname()[1]
            data_ports = (self.data_port,)  # where the dry run listens
            self._data = DataPlane(engine, self._sock, loop)
            self._data.start()
        self.controller = SessionController(self.target)
        self.controller.set_switch_address(switch_ip, a.switch_mac, data_ports)
        self.controller.set_drop_simulation(a.ingress_drop, a.egress_drop)
        session = SessionService(self.controller, clock=time.monotonic)
        self._sync = SyncService()
        self.grpc, self.control_port = await start_control_server(
            a.control_host, a.control_port, (session, self._sync)
        )
        log.info(
            "serving the SwitchML gRPC API on %s:%d for switch %s (%s target)",
            a.control_host,
            self.control_port,
            a.switch_ip,
            a.target,
        )

    async def stop(self) -> None:
        if self._sync is not None:  # waiting Barrier/Broadcast callers hear why at once
            self._sync.cancel_all("the SwitchML controller is shutting down")
        if self._data is not None:
            self._data.stop()
        if self.grpc is not None:
            await self.grpc.stop(grace=0.5)
        if self._sock is not None:
            self._sock.close()

    def write_ready_file(self, path: str) -> None:
        a = self.args
        info = {"control": f"{a.control_host}:{self.control_port}", "target": a.target}
        if self.data_port:
            info["switch"] = f"{a.switch_ip}:{self.data_port}"
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)


async def serve(args: argparse.Namespace) -> None:
    """Run the controller until SIGINT or SIGTERM."""
    ctl = Controller(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await ctl.start()
        if args.ready_file:
            ctl.write_ready_file(args.ready_file)
        await stop.wait()
    finally:
        await ctl.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(serve(args))
    except (ControllerError, OSError, ValueError, NotImplementedError) as exc:
        print(f"switchml_ctl: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
