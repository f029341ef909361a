"""Prometheus text exposition of the emulator's counters, over a tiny HTTP server.

:func:`render_metrics` turns a snapshot (see :mod:`swemu.observe.stats`) into the
Prometheus text format 0.0.4: ``# HELP`` / ``# TYPE`` lines, then samples with
escaped label values. :class:`MetricsServer` answers ``GET /metrics`` with it,
on asyncio streams in the emulator's own event loop — no dependency, and no
work at all between scrapes: a snapshot is taken per request, never per packet.

Metric names follow Prometheus conventions: counters end in ``_total``,
sizes in ``_bytes``; per-job series carry ``job`` (the session id), per-worker
series ``job``, ``rank`` and ``address``, drops ``reason``. ``job`` clashes with
the label Prometheus adds for the scrape target; Prometheus keeps ours as
``exported_job`` unless the scrape config sets ``honor_labels: true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger("swemu.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_HEAD = 8192  # bytes of request line and headers we read before giving up
REQUEST_TIMEOUT = 5.0  # seconds a client may take to send its request

Labels = dict[str, Any]
Sample = tuple[Labels, float]

#: Job counters with a metric of their own: engine name -> (metric, help).
_JOB_METRICS = {
    "pkts_in": ("switchml_packets_in_total", "Packets received from the job's workers."),
    "bytes_in": ("switchml_bytes_in_total", "UDP payload bytes received from the job's workers."),
    "aggregated": (
        "switchml_aggregated_total",
        "Contributions added to a slot (packets that were not retransmissions).",
    ),
    "retransmissions": (
        "switchml_retransmissions_total",
        "Packets of a worker that had already contributed to the slot.",
    ),
    "pkts_out": ("switchml_packets_out_total", "Result packets sent (every copy counted)."),
    "bytes_out": ("switchml_bytes_out_total", "UDP payload bytes of result packets sent."),
    "broadcast": (
        "switchml_broadcast_total",
        "Multicast results sent once to 127.255.255.255 for all workers (loopback broadcast).",
    ),
}
#: ``data_plane`` keys of one shard of a sharded emulator: ``shard<i>_<counter>``.
_SHARD_KEY = re.compile(r"shard(\d+)_(\w+)")
#: Job counters folded into labelled families.
_RESULT_KINDS = {"multicast": "multicast", "unicast": "unicast"}
_DROP_REASONS = {
    "drop_malformed": "malformed",
    "drop_wrong_size": "wrong_size",
    "drop_slot_range": "slot_range",
    "drop_wrong_shard": "wrong_shard",
}
_WORKER_METRICS = {
    "pkts_in": ("switchml_worker_packets_in_total", "Packets received from the worker."),
    "retransmissions": (
        "switchml_worker_retransmissions_total",
        "Retransmissions received from the worker.",
    ),
    "last": (
        "switchml_worker_last_total",
        "Slots the worker completed by being the last to contribute (the slowest has most).",
    ),
    "drops": ("switchml_worker_drops_total", "Packets of the worker that were dropped."),
}


def escape_label_value(value: object) -> str:
    """A label value as the text format wants it: ``\\``, ``"`` and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Exposition:
    """Collects metric families in order; each family is written once, whole."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[Sample]]] = {}

    def add(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        fam = self._families.setdefault(name, (kind, help_text, []))
        fam[2].extend(samples)

    def text(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text, samples) in self._families.items():
            lines.append(f"# HELP {name} {_escape_help(help_text)}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                if labels:
                    body = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items())
                    lines.append(f"{name}{{{body}}} {_format_value(value)}")
                else:
                    lines.append(f"{name} {_format_value(value)}")
        return "\n".join(lines) + "\n"


def _metric_name(name: str) -> str:
    """A counter name the engine may add later, made a valid metric name part."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def render_metrics(snap: dict[str, Any]) -> str:
    """The Prometheus text exposition (format 0.0.4) of one snapshot."""
    ex = _Exposition()
    jobs = snap["jobs"]

    ex.add(
        "switchml_up",
        "gauge",
        "1 while the emulator serves.",
        [({"version": snap.get("version", "")}, 1)],
    )
    if "uptime" in snap:
        ex.add(
            "switchml_uptime_seconds",
            "gauge",
            "Seconds since the emulator started.",
            [({}, float(snap["uptime"]))],
        )
    glob = snap["counters"]
    ex.add(
        "switchml_switch_packets_in_total",
        "counter",
        "Datagrams received by the switch, from registered workers or not.",
        [({}, glob.get("pkts_in", 0))],
    )

    # per job -------------------------------------------------------------
    drops: list[Sample] = [({"reason": "unknown_source"}, glob.get("drop_unknown_source", 0))]
    results: list[Sample] = []
    extra: dict[str, list[Sample]] = {}
    per_job: dict[str, list[Sample]] = {m: [] for m, _ in _JOB_METRICS.values()}
    for job in jobs:
        jl = {"job": job["session_id"]}
        for name, value in job["counters"].items():
            if name in _JOB_METRICS:
                per_job[_JOB_METRICS[name][0]].append((jl, value))
            elif name in _RESULT_KINDS:
                results.append(({**jl, "kind": _RESULT_KINDS[name]}, value))
            elif name in _DROP_REASONS:
                drops.append(({**jl, "reason": _DROP_REASONS[name]}, value))
            else:
                extra.setdefault(f"switchml_job_{_metric_name(name)}_total", []).append((jl, value))
    for name, help_text in _JOB_METRICS.values():
        ex.add(name, "counter", help_text, per_job[name])
    ex.add(
        "switchml_results_total",
        "counter",
        "Results sent: a multicast per completed slot, a unicast per answered retransmission.",
        results,
    )
    ex.add(
        "switchml_drops_total",
        "counter",
        "Packets dropped, by reason (unknown_source has no job).",
        drops,
    )
    for name, samples in extra.items():
        ex.add(name, "counter", "Job counter of the switch engine.", samples)

    # per worker ----------------------------------------------------------
    per_worker: dict[str, list[Sample]] = {m: [] for m, _ in _WORKER_METRICS.values()}
    for job in jobs:
        for w in job["workers"]:
            addr = f"{w['ip']}:{w['udp_port']}" if w["ip"] is not None else ""
            wl = {"job": job["session_id"], "rank": w["rank"], "address": addr}
            for name, (metric, _) in _WORKER_METRICS.items():
                if name in w:
                    per_worker[metric].append((wl, w[name]))
    for name, help_text in _WORKER_METRICS.values():
        ex.add(name, "counter", help_text, per_worker[name])

    # gauges --------------------------------------------------------------
    limits = snap.get("limits") or {}
    ex.add("switchml_jobs", "gauge", "Jobs registered.", [({}, len(jobs))])
    if "max_jobs" in limits:
        ex.add(
            "switchml_jobs_max", "gauge", "Jobs the switch can hold.", [({}, limits["max_jobs"])]
        )
    ex.add(
        "switchml_pool_memory_bytes",
        "gauge",
        "Memory of all jobs' slot pools.",
        [({}, snap["memory_in_use"])],
    )
    ex.add(
        "switchml_pool_memory_max_bytes",
        "gauge",
        "Memory budget for the pools (--max-pool-memory).",
        [({}, snap["max_pool_memory"])],
    )
    ex.add(
        "switchml_job_workers",
        "gauge",
        "Workers of the job.",
        [({"job": j["session_id"]}, j["num_workers"]) for j in jobs],
    )
    ex.add(
        "switchml_job_pool_slots",
        "gauge",
        "Slots of the job's pool (each exists once per shadow set).",
        [({"job": j["session_id"]}, j["pool_size"]) for j in jobs],
    )
    ex.add(
        "switchml_job_memory_bytes",
        "gauge",
        "Memory of the job's pool.",
        [({"job": j["session_id"]}, j["memory_bytes"]) for j in jobs],
    )
    ex.add(
        "switchml_slots_pending",
        "gauge",
        "Slots waiting for contributions, per shadow set.",
        [
            ({"job": j["session_id"], "set": s}, n)
            for j in jobs
            for s, n in enumerate(j["slots_pending"])
        ],
    )
    ex.add(
        "switchml_slots_holding",
        "gauge",
        "Slots holding a contribution or a result, per shadow set.",
        [
            ({"job": j["session_id"], "set": s}, n)
            for j in jobs
            for s, n in enumerate(j["slots_holding"])
        ],
    )
    ex.add(
        "switchml_jobs_released_total",
        "counter",
        "Jobs released, by reason.",
        [({"reason": k}, v) for k, v in snap.get("released", {}).items()],
    )

    # socket layer, faults, capture -----------------------------------------
    per_shard: dict[str, list[Sample]] = {}
    for name, value in (snap.get("data_plane") or {}).items():
        shard = _SHARD_KEY.fullmatch(name)
        if shard is not None:  # shard<i>_<counter>: one process of `serve --shards`
            per_shard.setdefault(shard[2], []).append(({"shard": shard[1]}, value))
        elif name == "shards":
            ex.add(
                "switchml_dataplane_shards",
                "gauge",
                "Data-plane processes (serve --shards).",
                [({}, value)],
            )
        else:
            ex.add(
                f"switchml_dataplane_{_metric_name(name)}_total",
                "counter",
                f"Data-plane socket layer: {name}.",
                [({}, value)],
            )
    for name, samples in per_shard.items():
        ex.add(
            f"switchml_shard_{_metric_name(name)}_total",
            "counter",
            f"Per data-plane shard: {name}.",
            samples,
        )
    faults: list[Sample] = [({"kind": k}, v) for k, v in (snap.get("faults") or {}).items()]
    for job in jobs:
        faults += [
            ({"job": job["session_id"], "kind": k}, v) for k, v in (job.get("faults") or {}).items()
        ]
    ex.add(
        "switchml_faults_injected_total",
        "counter",
        "Faults injected into the traffic, by job and kind.",
        faults,
    )
    cap = snap.get("capture") or {}
    if cap:
        ex.add(
            "switchml_capture_packets_total",
            "counter",
            "Packets written to the pcap capture.",
            [({}, cap.get("packets", 0))],
        )
        ex.add(
            "switchml_capture_dropped_total",
            "counter",
            "Packets not written because the capture reached its bound.",
            [({}, cap.get("dropped", 0))],
        )
    return ex.text()


class MetricsServer:
    """``GET /metrics`` over HTTP/1.x, one response per connection.

    ``snapshot`` is called per scrape. Anything else than a GET (or HEAD) of
    ``/metrics`` or ``/`` gets a 404 or 405; a request head larger than 8 KiB
    or slower than 5 s is answered 400/408 and closed.
    """

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
        host: str,
        port: int,
    ) -> None:
        self.snapshot = snapshot
        self.host = host
        self.requested_port = port
        self.port = 0
        self.scrapes = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Bind and start serving; raises OSError naming the address if it cannot."""
        try:
            self._server = await asyncio.start_server(
                self._handle, self.host, self.requested_port, limit=MAX_REQUEST_HEAD
            )
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {self.host}:{self.requested_port}: {exc.strerror or exc}"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body, ctype, head_only = await self._respond(reader)
            reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
            reason = {405: "Method Not Allowed", 408: "Request Timeout"}.get(status, reason)
            data = body.encode()
            headers = (
                f"HTTP/1.1 {status} {reason}\r\n"
                f"Content-Type: {ctype}\r\n"
                f"Content-Length: {len(data)}\r\n"
                "Connection: close\r\n"
            )
            if status == 405:
                headers += "Allow: GET, HEAD\r\n"
            writer.write(headers.encode("ascii") + b"\r\n" + (b"" if head_only else data))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        except Exception:  # a bug here must not take the emulator down
            log.exception("metrics request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[int, str, str, bool]:
        plain = "text/plain; charset=utf-8"
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
        except asyncio.TimeoutError:
            return 408, "request timeout\n", plain, False
        except asyncio.LimitOverrunError:
            return 400, "request head too large\n", plain, False
        except asyncio.IncompleteReadError as exc:
            head = exc.partial  # a client that sends one line and shuts down writing
            if not head.strip():
                raise
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, "bad request line\n", plain, False
        method, target = parts[0], parts[1].split("?", 1)[0]
        head_only = method == "HEAD"
        if method not in ("GET", "HEAD"):
            return 405, "only GET and HEAD\n", plain, False
        if target == "/metrics":
            self.scrapes += 1
            snap = self.snapshot()
            if inspect.isawaitable(snap):  # a sharded emulator asks its shards
                snap = await snap
            return 200, render_metrics(snap), CONTENT_TYPE, head_only
        if target == "/":
            return 200, "switchml-emu: metrics at /metrics\n", plain, head_only
        return 404, "not found: try /metrics\n", plain, head_only
