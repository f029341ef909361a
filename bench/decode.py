"""``python -m bench decode``: how fast ``switchml-emu decode`` reads a big capture.

A synthetic capture of ``--size`` bytes (default 1 GiB) is written with
:class:`swemu.observe.pcap.PcapWriter` as the emulator records a job: per round of a
slot, W contributions, then the multicast's W copies; every ``--loss-every``-th
round one worker retransmits and gets a unicast. Then, side by side on that one
file (in the page cache after the first pass):

* ``parse (packets)``: :func:`swemu.observe.pcap.read_pcap`, one ``CapturedPacket`` per
  datagram (the record-by-record interface);
* ``parse (batches)``: :func:`swemu.observe.pcap.read_pcap_batches`, numpy columns;
* ``decode``: :class:`swemu.observe.decode.Decoder` over the batches, every event
  classified (no output);
* ``switchml-emu decode > /dev/null``: the command, every row printed;
* ``first rows``: the command until its first 10 rows arrived (``| head``).

Each is reported in MB/s of capture file and packets/s, and as a ratio to the
batch parser, next to the CPU seconds it used (``time.process_time`` for the
stages run in this process, ``getrusage(RUSAGE_CHILDREN)`` for the command's
process): CPU / wall near 1 is a stage bound by its own computing, well below 1
one that waits (for the disk, a pipe, a child starting). Results go to
``--out`` (``decode.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

WORKER_IP = 0x0A000001  # 10.0.0.1 + rank
SWITCH = (0x0A000064, 48890)  # 10.0.0.100:48890, outside 0xBEE0-0xBEEF: the port is inferred


def make_capture(
    path: Path, size: int, *, size_code: int = 3, workers: int = 4, loss_every: int = 100
) -> int:
    """Write a capture of about ``size`` bytes; return its packet count.

    Round r uses slot ``r % 256`` and set ``r // 256 % 2``: W contributions,
    the result's W copies, and on every ``loss_every``-th round worker 0's
    retransmission and the unicast that answers it. Records are assembled a
    block of rounds at a time with numpy (one ``write_batch`` per block).
    """
    from swemu.observe.pcap import PcapWriter
    from swemu.protocol import wire

    plen = wire.packet_len(size_code)
    block, pool = 1024, 256
    rng = np.random.default_rng(0)
    template = rng.integers(-1000, 1000, 32 << size_code).astype(">i4").view(np.uint8)
    ranks = np.arange(workers)
    # one round's packets: (payload row: a worker's or the result, from worker?, rank)
    row_of = np.concatenate([ranks, np.full(workers, workers), [0, workers]])
    to_sw = np.concatenate([np.ones(workers, bool), np.zeros(workers, bool), [True, False]])
    rank_of = np.concatenate([ranks, ranks, [0, 0]])
    wip, wport = WORKER_IP + rank_of, 40000 + rank_of
    ts, r0 = 1_700_000_000.0, 0
    with PcapWriter(path, max_packets=None, max_bytes=size) as w:
        while not w.full:
            r = r0 + np.arange(block)
            buf = np.empty((block, workers + 1, plen), np.uint8)
            buf[:, :, wire.HEADER_LEN :] = template
            buf[:, workers, -4:] = 7  # the result differs from the contributions
            h = buf[:, :, : wire.HEADER_LEN].copy().view(wire.HEADER_DTYPE)[..., 0]
            h["type_size"] = (wire.MSG_TYPE << 4) | size_code
            h["job_number"] = 1
            h["tsi"] = r[:, None]
            h["pool_index"] = ((r // pool % 2) << 15 | (r % pool))[:, None]
            buf[:, :, : wire.HEADER_LEN] = h[..., None].view(np.uint8)
            keep = np.ones((block, row_of.size), bool)
            keep[:, -2:] = ((r % loss_every) == loss_every - 1)[:, None]
            rows = ((np.arange(block) * (workers + 1))[:, None] + row_of)[keep]
            pick = np.broadcast_to(np.arange(row_of.size), keep.shape)[keep]
            n = rows.size
            stamps = ts + np.arange(n) * 2e-6
            w.write_batch(
                buf.reshape(-1, plen),
                np.full(block * (workers + 1), plen),
                np.where(to_sw[pick], wip[pick], SWITCH[0]),
                np.where(to_sw[pick], wport[pick], SWITCH[1]),
                np.where(to_sw[pick], SWITCH[0], wip[pick]),
                np.where(to_sw[pick], SWITCH[1], wport[pick]),
                stamps,
                rows=rows,
            )
            ts, r0 = float(stamps[-1]) + 2e-6, r0 + block
        return w.packets


def _children_cpu() -> float:
    """User + system CPU seconds of this process's terminated, waited-for children."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _timed(fn) -> tuple[float, float, float, Any]:
    """Run ``fn``; return its wall seconds, the CPU seconds this process spent
    in it (all threads), those of the children it ran and waited for, and its
    result."""
    cpu, kids, t = time.process_time(), _children_cpu(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t
    return wall, time.process_time() - cpu, _children_cpu() - kids, out


def run(size: int, size_code: int, workers: int, loss_every: int, log=print) -> dict[str, Any]:
    """Make the capture, time every way of reading it, remove it."""
    from swemu.launch import child_env
    from swemu.observe.decode import Decoder, decode_batches
    from swemu.observe.pcap import read_pcap, read_pcap_batches

    with tempfile.TemporaryDirectory(prefix="swemu-bench-decode-") as tmp:
        path = Path(tmp) / "big.pcap"
        log(f"writing a {size / 2**20:.0f} MiB capture (size code {size_code}, W={workers})")
        packets = make_capture(
            path, size, size_code=size_code, workers=workers, loss_every=loss_every
        )
        nbytes = path.stat().st_size

        def parse_batches() -> int:
            return sum(len(b) for b in read_pcap_batches(path))

        def parse_packets() -> int:
            return sum(1 for _ in read_pcap(path))

        def decode() -> int:
            return sum(1 for _ in decode_batches(read_pcap_batches(path), Decoder()))

        cmd = [
            sys.executable,
            "-c",
            "from cli.main import emu_main; emu_main()",
            "decode",
            str(path),
        ]

        def command() -> int:
            with open(os.devnull, "w") as null:
                return subprocess.run(cmd, stdout=null, env=child_env(), check=True).returncode

        def first_rows() -> int:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=child_env())
            assert proc.stdout is not None
            lines = [proc.stdout.readline() for _ in range(11)]
            proc.stdout.close()
            proc.wait()
            return sum(1 for line in lines if line)  # the heading and 10 rows

        parse_batches()  # the file into the page cache, the modules imported
        rows = []
        for name, fn in (
            ("parse (batches)", parse_batches),
            ("parse (packets)", parse_packets),
            ("decode", decode),
            ("switchml-emu decode > /dev/null", command),
            ("first rows (| head)", first_rows),
        ):
            log(f"  {name} ...")
            seconds, cpu_self, cpu_children, count = _timed(fn)
            rows.append(
                {
                    "what": name,
                    "seconds": seconds,
                    "cpu_s": cpu_self + cpu_children,
                    "cpu_self_s": cpu_self,
                    "cpu_children_s": cpu_children,
                    "result": count,
                }
            )
        base = rows[0]["seconds"]
        for r in rows:
            r["cpu_per_wall"] = r["cpu_s"] / r["seconds"]
            r["mb_per_s"] = nbytes / 1e6 / r["seconds"]
            r["packets_per_s"] = packets / r["seconds"]
            r["time_vs_batches"] = r["seconds"] / base
    return {
        "file_bytes": nbytes,
        "packets": packets,
        "size_code": size_code,
        "workers": workers,
        "cpus": os.cpu_count(),
        "results": rows,  # seconds: wall; cpu_s = cpu_self_s (this process) + cpu_children_s
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"{data['file_bytes'] / 2**20:.0f} MiB capture, {data['packets']} packets "
        f"(size code {data['size_code']}, W={data['workers']}), {data['cpus']} CPUs",
        "",
        "| what | seconds | CPU s | CPU / wall | MB/s | packets/s | time / parse (batches) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["results"]:
        what = r["what"].replace("|", "\\|")  # "first rows (| head)" in a table cell
        lines.append(
            f"| {what} | {r['seconds']:.2f} | {r['cpu_s']:.2f} | {r['cpu_per_wall']:.2f} | "
            f"{r['mb_per_s']:.0f} | "
            f"{r['packets_per_s'] / 1e3:.0f} k | {r['time_vs_batches']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from swemu.options import parse_size

    def size(text: str) -> int:
        try:
            return parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    p = argparse.ArgumentParser(prog="python -m bench decode", description=__doc__.splitlines()[0])
    p.add_argument("--size", type=size, default=1 << 30, help="capture size (e.g. 256Mi)")
    p.add_argument("--size-code", type=int, default=3, choices=range(8))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--loss-every", type=int, default=100)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    data = run(
        args.size,
        args.size_code,
        args.workers,
        args.loss_every,
        log=lambda m: print(m, file=sys.stderr),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode.json").write_text(json.dumps(data, indent=2))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
