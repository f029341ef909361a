"""TofinoTarget: the control-plane model of :mod:`swemu.core.controller` written into the
tables of p4/switchml.p4 through BF Runtime (gRPC, Intel SDE).

Thin by design: the session rules are :class:`swemu.core.controller.SessionController`'s;
this class turns its calls into table entries (p4/README.md, "The control
plane's part") and keeps only the bookkeeping the hardware needs:

* a job gets a ``job_id`` (1..255, the per-job counter index and multicast group
  id ``mgid``) and a free range ``[pool_base, pool_base + entries)`` of the
  register pool all jobs share (first fit), one entry per slot at size code 1 and
  four at size code 3 (a quarter of the values each, p4/checks.p4); creating it
  zeroes the bitmap and count registers over the range (values and exponents are
  written on first use);
* a worker is a ``worker_by_address`` entry (or ``worker_by_ip`` for udp_port 0),
  a ``worker_address`` entry and a multicast node, both keyed by the replication
  id ``rid = job_id << 5 | rank``; the node goes to the worker's device port
  (``ports``: worker IPv4 -> :class:`WorkerPort`, since a UdpSession request
  carries no port);
* the switch's address is two ``arp_icmp`` entries (ARP request, echo request).

``bfrt_grpc`` is imported only by :meth:`TofinoTarget.connect`, so this module
loads anywhere; tests drive it with :class:`p4.controller.recording_bfrt.RecordingBfrt`.
It has not run against a switch or the Tofino model here (no SDE): see p4/README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from swemu.core.controller import (
    BITMAP_WORKERS,
    INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED,
    VALUE_FORMATS,
    DropSimulation,
    JobParams,
    RegistrationError,
    SwitchAddress,
    TargetLimits,
    WorkerAddress,
    ipv4_str,
    table_state,
)

# Tables, registers and actions of p4/switchml.p4 (instance names of switchml.p4's
# Ingress/Egress controls; p4_schema checks them against the source in tests).
WORKER_BY_ADDRESS = "pipe.Ingress.worker_lookup.worker_by_address"
WORKER_BY_IP = "pipe.Ingress.worker_lookup.worker_by_ip"
SET_WORKER = "Ingress.worker_lookup.set_worker"
WORKER_ADDRESS = "pipe.Egress.rewrite_result.worker_address"
TO_WORKER = "Egress.rewrite_result.to_worker"
TO_WORKER_BY_IP = "Egress.rewrite_result.to_worker_by_ip"
ARP_ICMP = "pipe.Ingress.arp_icmp.arp_icmp"
REPLY_ARP = "Ingress.arp_icmp.reply_arp"
REPLY_ICMP_ECHO = "Ingress.arp_icmp.reply_icmp_echo"
WORKER_BITMAP = "pipe.Ingress.worker_bitmap.worker_bitmap"  # indexed by slot_index
COUNT = "pipe.Ingress.count_workers.count"  # indexed by pool_index = slot_index ++ set
PRE_MGID = "$pre.mgid"
PRE_NODE = "$pre.node"

# Sizes of p4/configuration.p4 (tests compare them with the source).
NUM_POOL_SLOTS = 8192
MAX_JOB_ID = 255  # JOB_ID_BITS = 8; job 0 counts unknown sources
MAX_WORKER_ENTRIES = 1024
RID_WORKER_BITS = 5  # rid = job_id << 5 | rank (p4/result.p4)
#: Register entries a slot takes, per size code the program aggregates
#: (SIZE_CODE_ONE_PASS, SIZE_CODE_FOUR_PASSES x QUARTERS).
ENTRIES_PER_SLOT = {1: 1, 3: 4}
SIZE_CODES = tuple(ENTRIES_PER_SLOT)
ARP_OPCODE_REQUEST = 1
ICMP_ECHO_REQUEST = 8

#: Tables whose entries this controller owns: cleared when it starts.
OWNED_TABLES = (WORKER_BY_ADDRESS, WORKER_BY_IP, WORKER_ADDRESS, ARP_ICMP, PRE_MGID, PRE_NODE)


@dataclass(frozen=True)
class WorkerPort:
    """Where a worker host hangs off the switch: its device port, and its MAC for
    requests that carry none."""

    dev_port: int
    mac: int | None = None


def job_entries(job: JobParams) -> int:
    """Register entries a job of ``job.pool_size`` slots takes from the shared pool."""
    return job.pool_size * ENTRIES_PER_SLOT[job.size_code]


@dataclass
class TofinoJob:
    """A job on the switch: its parameters and what was allocated for it."""

    params: JobParams
    job_id: int
    pool_base: int
    workers: dict[int, WorkerAddress] = field(default_factory=dict)  # as written

    @property
    def mgid(self) -> int:
        return self.job_id

    @property
    def entries(self) -> int:
        """Register entries of the pool the job holds."""
        return job_entries(self.params)

    def rid(self, rank: int) -> int:
        return self.job_id << RID_WORKER_BITS | rank


class TofinoTarget:
    """The model's tables on a Tofino running p4/switchml.p4 (see the module docstring).

    ``bfrt_info``, ``gc`` and ``device`` are what ``bfrt_grpc.client`` provides
    (``interface.bfrt_info_get(...)``, the module itself, ``gc.Target(...)``).
    """

    def __init__(
        self,
        bfrt_info: Any,
        gc: Any,
        device: Any,
        *,
        ports: Mapping[int, WorkerPort] | None = None,
        default_port: WorkerPort | None = None,
        default_pool_size: int = 1024,
        clear: bool = True,
    ) -> None:
        if not 1 <= default_pool_size <= NUM_POOL_SLOTS:
            raise ValueError(f"default pool size must be in 1..{NUM_POOL_SLOTS}")
        self.bfrt_info = bfrt_info
        self.gc = gc
        self.device = device
        self.ports = dict(ports or {})
        self.default_port = default_port
        self.jobs: dict[int, TofinoJob] = {}  # job_id -> job
        self.switch: SwitchAddress | None = None
        self.drops = DropSimulation()
        self.interface: Any = None  # the bfrt_grpc ClientInterface after connect()
        self._limits = TargetLimits(
            max_workers=BITMAP_WORKERS,
            max_pool_size=NUM_POOL_SLOTS,
            default_pool_size=default_pool_size,
            size_codes=frozenset(SIZE_CODES),
            # the 16-bit format is two lanes per 32-bit register word (docs/protocol.md
            # section 4.2): set_worker's value_formats, echoed by NextStep
            value_formats=frozenset(VALUE_FORMATS),
        )
        if clear:
            self.clear()

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        program: str = "switchml",
        device_id: int = 0,
        client_id: int = 0,
        **kwargs: Any,
    ) -> TofinoTarget:
        """Connect to a BF Runtime server (``HOST:50052``) running ``program``."""
        import bfrt_grpc.client as gc  # only with the Intel SDE's Python

        interface = gc.ClientInterface(address, client_id=client_id, device_id=device_id)
        bfrt_info = interface.bfrt_info_get(program)
        interface.bind_pipeline_config(program)
        target = cls(bfrt_info, gc, gc.Target(device_id=device_id, pipe_id=0xFFFF), **kwargs)
        target.interface = interface  # keep the stream open
        return target

    # ------------------------------------------------------------------ helpers
    def _table(self, name: str) -> Any:
        return self.bfrt_info.table_get(name)

    def _key(self, table: Any, **fields: Any) -> Any:
        """Exact fields as ``name=value``, ternary ones as ``name=(value, mask)``."""
        kt = self.gc.KeyTuple
        return table.make_key(
            [kt(n, *v) if isinstance(v, tuple) else kt(n, v) for n, v in fields.items()]
        )

    def _data(self, table: Any, action: str | None = None, **fields: Any) -> Any:
        """Scalar fields as ``name=value``; lists are integer arrays."""
        dt = self.gc.DataTuple
        tuples = [
            dt(n, int_arr_val=v) if isinstance(v, list) else dt(n, v) for n, v in fields.items()
        ]
        return table.make_data(tuples, action) if action else table.make_data(tuples)

    def _mgid_data(self, table: Any, rids: list[int]) -> Any:
        """A multicast group of the nodes ``rids``, none of them pruned (no L1 XID)."""
        dt = self.gc.DataTuple
        return table.make_data(
            [
                dt("$MULTICAST_NODE_ID", int_arr_val=rids),
                dt("$MULTICAST_NODE_L1_XID_VALID", bool_arr_val=[False] * len(rids)),
                dt("$MULTICAST_NODE_L1_XID", int_arr_val=[0] * len(rids)),
            ]
        )

    def clear(self) -> None:
        """Delete every entry of the tables this controller owns (a fresh start)."""
        for name in OWNED_TABLES:
            table = self._table(name)
            keys = [k for _, k in table.entry_get(self.device, None, {"from_hw": False})]
            if keys:
                table.entry_del(self.device, keys)

    def _zero(self, name: str, first: int, count: int) -> None:
        table = self._table(name)
        zero = self._data(table, **dict.fromkeys(table.info.data_field_name_list_get(), 0))
        keys = [self._key(table, **{"$REGISTER_INDEX": i}) for i in range(first, first + count)]
        table.entry_mod(self.device, keys, [zero] * count)

    def _free_range(self, size: int, exclude: TofinoJob | None) -> int | None:
        """First fit: the lowest pool_base with ``size`` free entries after it."""
        used = sorted(
            (j.pool_base, j.pool_base + j.entries) for j in self.jobs.values() if j is not exclude
        )
        base = 0
        for start, end in used:
            if start - base >= size:
                return base
            base = max(base, end)
        return base if NUM_POOL_SLOTS - base >= size else None

    def _port_of(self, worker: WorkerAddress) -> WorkerPort | None:
        return self.ports.get(worker.ipv4, self.default_port)

    def _mgid_nodes(self, job: TofinoJob) -> None:
        """Point the job's multicast group at the nodes of its current workers."""
        table = self._table(PRE_MGID)
        data = self._mgid_data(table, [job.rid(r) for r in sorted(job.workers)])
        table.entry_mod(self.device, [self._key(table, **{"$MGID": job.mgid})], [data])

    # ------------------------------------------------------------------ Target
    @property
    def limits(self) -> TargetLimits:
        return self._limits

    def set_switch_address(self, address: SwitchAddress) -> None:
        table = self._table(ARP_ICMP)
        if self.switch is not None:
            table.entry_del(self.device, self._arp_keys(table, self.switch.ipv4))
        arp_key, icmp_key = self._arp_keys(table, address.ipv4)
        table.entry_add(
            self.device,
            [arp_key, icmp_key],
            [
                self._data(table, REPLY_ARP, switch_mac=address.mac),
                self._data(table, REPLY_ICMP_ECHO, switch_mac=address.mac),
            ],
        )
        self.switch = address

    def _arp_keys(self, table: Any, ip: int) -> list[Any]:
        """The two arp_icmp keys of the switch's address (p4/arp_icmp.p4's comment)."""
        full = 0xFFFFFFFF
        arp = self._key(
            table,
            **{
                "hdr.arp.$valid": True,
                "hdr.arp.opcode": (ARP_OPCODE_REQUEST, 0xFFFF),
                "hdr.arp.target_proto_addr": (ip, full),
                "hdr.icmp.$valid": False,
                "hdr.icmp.msg_type": (0, 0),
                "hdr.ipv4.dst_addr": (0, 0),
            },
        )
        icmp = self._key(
            table,
            **{
                "hdr.arp.$valid": False,
                "hdr.arp.opcode": (0, 0),
                "hdr.arp.target_proto_addr": (0, 0),
                "hdr.icmp.$valid": True,
                "hdr.icmp.msg_type": (ICMP_ECHO_REQUEST, 0xFF),
                "hdr.ipv4.dst_addr": (ip, full),
            },
        )
        return [arp, icmp]

    def room_for_job(self, job: JobParams, replacing: TofinoJob | None) -> RegistrationError | None:
        others = [j for j in self.jobs.values() if j is not replacing]
        if len(others) >= MAX_JOB_ID:
            return RegistrationError(
                RESOURCE_EXHAUSTED, f"all {MAX_JOB_ID} job ids of the switch are in use"
            )
        entries = job_entries(job)
        if self._free_range(entries, replacing) is None:
            used = sum(j.entries for j in others)
            size = (
                f"{job.pool_size} slots"
                if entries == job.pool_size
                else (f"{entries} entries ({job.pool_size} slots at size code {job.size_code})")
            )
            return RegistrationError(
                RESOURCE_EXHAUSTED,
                f"no free range of {size} in the switch's pool of "
                f"{NUM_POOL_SLOTS} ({used} in use by {len(others)} jobs)",
            )
        reserved = sum(j.params.num_workers for j in others)
        if reserved + job.num_workers > MAX_WORKER_ENTRIES:
            return RegistrationError(
                RESOURCE_EXHAUSTED,
                f"{job.num_workers} workers do not fit: {reserved} of the switch's "
                f"{MAX_WORKER_ENTRIES} worker entries are reserved",
            )
        return None

    def check_worker(self, worker: WorkerAddress) -> RegistrationError | None:
        ip = ipv4_str(worker.ipv4)
        port = self._port_of(worker)
        if port is None:
            return RegistrationError(
                INVALID_ARGUMENT,
                f"no device port is known for worker {ip}: start the controller with "
                f"--worker {ip}=DEV_PORT/MAC",
            )
        if not worker.mac and not port.mac:
            return RegistrationError(
                INVALID_ARGUMENT,
                f"no MAC address for worker {ip}: send it in UdpSession.mac or start the "
                f"controller with --worker {ip}={port.dev_port}/MAC",
            )
        return None

    def create_job(self, job: JobParams, *, now: float) -> TofinoJob:
        job_id = min(set(range(1, MAX_JOB_ID + 1)) - set(self.jobs))
        entries = job_entries(job)
        base = self._free_range(entries, None)
        assert base is not None, "room_for_job was not asked"
        # a new job starts from idle slots: no bitmap bit set, no count pending
        self._zero(WORKER_BITMAP, base, entries)
        self._zero(COUNT, 2 * base, 2 * entries)
        entry = TofinoJob(job, job_id, base)
        table = self._table(PRE_MGID)
        table.entry_add(
            self.device,
            [self._key(table, **{"$MGID": entry.mgid})],
            [self._mgid_data(table, [])],
        )
        self.jobs[job_id] = entry
        return entry

    def delete_job(self, handle: TofinoJob, *, why: str) -> None:
        for rank in sorted(handle.workers):
            self.remove_worker(handle, rank)
        table = self._table(PRE_MGID)
        table.entry_del(self.device, [self._key(table, **{"$MGID": handle.mgid})])
        del self.jobs[handle.job_id]

    def set_worker(
        self, handle: TofinoJob, rank: int, worker: WorkerAddress, *, now: float
    ) -> None:
        p, port = handle.params, self._port_of(worker)
        assert port is not None, "check_worker was not asked"
        mac = worker.mac or port.mac or 0
        rid = handle.rid(rank)
        lookup = self._table(WORKER_BY_ADDRESS if worker.udp_port else WORKER_BY_IP)
        key = {"hdr.ipv4.src_addr": worker.ipv4}
        if worker.udp_port:
            key["hdr.udp.src_port"] = worker.udp_port
        lookup.entry_add(
            self.device,
            [self._key(lookup, **key)],
            [
                self._data(
                    lookup,
                    SET_WORKER,
                    job_id=handle.job_id,
                    worker_id=rank,
                    worker_bit=1 << rank,
                    num_workers=p.num_workers,
                    size_code=p.size_code,
                    pool_base=handle.pool_base,
                    pool_size=p.pool_size,
                    mgid=handle.mgid,
                    value_formats=p.value_formats,
                )
            ],
        )
        rewrite = self._table(WORKER_ADDRESS)
        if worker.udp_port:
            data = self._data(rewrite, TO_WORKER, mac=mac, ip=worker.ipv4, udp_port=worker.udp_port)
        else:
            data = self._data(rewrite, TO_WORKER_BY_IP, mac=mac, ip=worker.ipv4)
        rewrite.entry_add(
            self.device, [self._key(rewrite, **{"eg_intr_md.egress_rid": rid})], [data]
        )
        node = self._table(PRE_NODE)
        node.entry_add(
            self.device,
            [self._key(node, **{"$MULTICAST_NODE_ID": rid})],
            [
                self._data(
                    node,
                    **{
                        "$MULTICAST_RID": rid,
                        "$MULTICAST_LAG_ID": [],
                        "$DEV_PORT": [port.dev_port],
                    },
                )
            ],
        )
        handle.workers[rank] = WorkerAddress(worker.ipv4, worker.udp_port, mac)
        self._mgid_nodes(handle)

    def remove_worker(self, handle: TofinoJob, rank: int) -> None:
        worker = handle.workers.pop(rank)
        rid = handle.rid(rank)
        self._mgid_nodes(handle)  # out of the group before its node goes
        node = self._table(PRE_NODE)
        node.entry_del(self.device, [self._key(node, **{"$MULTICAST_NODE_ID": rid})])
        rewrite = self._table(WORKER_ADDRESS)
        rewrite.entry_del(self.device, [self._key(rewrite, **{"eg_intr_md.egress_rid": rid})])
        lookup = self._table(WORKER_BY_ADDRESS if worker.udp_port else WORKER_BY_IP)
        key = {"hdr.ipv4.src_addr": worker.ipv4}
        if worker.udp_port:
            key["hdr.udp.src_port"] = worker.udp_port
        lookup.entry_del(self.device, [self._key(lookup, **key)])

    def broadcast_port(self, handle: TofinoJob) -> int:
        return 0  # a Tofino multicasts through its replication engine

    def set_drop_simulation(self, drops: DropSimulation) -> None:
        if drops.active:
            raise NotImplementedError(
                "p4/switchml.p4 has no drop simulator (p4app-switchML's sets drop "
                "probabilities in the ingress port metadata); only 0 can be set on this switch"
            )
        self.drops = drops

    def watch_releases(self, callback: Callable[[Any], None]) -> None:
        """A Tofino never frees a job by itself: nothing to report."""

    def read_state(self) -> dict[str, Any]:
        """Read back from the switch's tables (not from this object's bookkeeping)."""
        by_id = self.jobs
        flags = {"from_hw": False}
        workers = []
        for name in (WORKER_BY_ADDRESS, WORKER_BY_IP):
            for data, key in self._table(name).entry_get(self.device, None, flags):
                k, d = key.to_dict(), data.to_dict()
                port = k["hdr.udp.src_port"]["value"] if name == WORKER_BY_ADDRESS else 0
                sid = by_id[d["job_id"]].params.session_id
                workers.append((k["hdr.ipv4.src_addr"]["value"], port, sid, d["worker_id"]))
        destinations = []
        for data, key in self._table(WORKER_ADDRESS).entry_get(self.device, None, flags):
            rid, d = key.to_dict()["eg_intr_md.egress_rid"]["value"], data.to_dict()
            job = by_id[rid >> RID_WORKER_BITS]
            address = WorkerAddress(d["ip"], d.get("udp_port", 0), d["mac"])
            destinations.append((job.params.session_id, rid & (BITMAP_WORKERS - 1), address))
        multicast = {}
        for data, key in self._table(PRE_MGID).entry_get(self.device, None, flags):
            job = by_id[key.to_dict()["$MGID"]["value"]]
            nodes = data.to_dict()["$MULTICAST_NODE_ID"]
            multicast[job.params.session_id] = [r & (BITMAP_WORKERS - 1) for r in nodes]
        return table_state(
            switch=self.switch,
            drops=self.drops,
            jobs={j.params.session_id: j.params for j in by_id.values()},
            workers=workers,
            destinations=destinations,
            multicast=multicast,
            target={
                "kind": "tofino",
                "jobs": {
                    j.params.session_id: {
                        "job_id": j.job_id,
                        "mgid": j.mgid,
                        "pool_base": j.pool_base,
                    }
                    for j in sorted(by_id.values(), key=lambda j: j.job_id)
                },
            },
        )
