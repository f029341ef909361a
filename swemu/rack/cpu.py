"""CPU counters of the machine and of processes, sampled around each timed collective.

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of all cores since boot, from /proc/stat
    (busy includes irq and softirq: the kernel's packet forwarding)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return (total - idle) / _CLK_TCK, total / _CLK_TCK


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(rest[11]) + int(rest[12])) / _CLK_TCK  # fields 14, 15 of stat(5)


def udp_errors(pid: int) -> int:
    """UDP datagrams the kernel dropped (receive-buffer overflows and other input
    errors, send-buffer overflows) in the network namespace of process ``pid``."""
    try:
        with open(f"/proc/{pid}/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Udp:")]
    except OSError:
        return 0
    if len(rows) < 2:
        return 0
    counters = dict(zip(rows[0][1:], map(int, rows[1][1:])))
    return counters.get("InErrors", 0) + counters.get("SndbufErrors", 0)


@dataclass
class CPUSample:
    """Counters at one instant: the machine's and each of our processes'."""

    wall: float
    busy: float
    total: float
    procs: dict[str, float]

    @classmethod
    def take(cls, pids: dict[str, int]) -> CPUSample:
        busy, total = machine_cpu()
        return cls(time.monotonic(), busy, total, {k: process_cpu(p) for k, p in pids.items()})

    def since(self, start: CPUSample) -> dict[str, float]:
        """Utilisation between ``start`` and this sample: the machine's busy fraction
        of all cores, and cores used by the emulators (every process named
        ``emulator...``) and by all our processes."""
        wall = max(self.wall - start.wall, 1e-9)
        used = {k: self.procs[k] - start.procs.get(k, 0.0) for k in self.procs}
        return {
            "machine_busy": min(
                1.0, (self.busy - start.busy) / max(self.total - start.total, 1e-9)
            ),
            "emulator_cores": sum(v for k, v in used.items() if k.startswith("emulator")) / wall,
            "ours_cores": sum(used.values()) / wall,
        }
