"""Replay the conformance vectors (tests/vectors/*.json) against the P4 program with PTF.

The same JSON files that ``tests/test_conformance.py`` runs against the emulator engine
are sent, as Ethernet/IPv4/UDP frames, to the Tofino model or a real switch running
``p4/switchml.p4``; every expected result frame must come out of the worker's port and
nothing else. Where the vector says which action the switch took, the per-job action
counter of the program (``CountActions``) must have counted it.

Not run in CI: it needs P4 Studio (``ptf``, ``bfrt_grpc``) and a running switch. See
p4/README.md, "Replaying the conformance vectors", for the command line. Test
parameters (``--test-params "k=v;k=v"``):

    p4_name       program name given to bf-p4c / bfrt (default "switchml")
    grpc_addr     BF Runtime server (default "localhost:50052")
    vectors       directory of the vectors (default tests/vectors of this repository)
    only          comma-separated vector names to run (default: all that fit the switch)
    ports         worker IP to device port, "10.0.0.1=0,10.0.0.2=4" (default: PTF's
                  ports in order of first appearance of each IP in a vector)
    switch_mac    the switch's MAC address (default "02:00:00:00:00:fe")
    check_actions 1/0: also check the action counters (default 1)

Vectors of jobs with a size code other than 1 and 3 are skipped: the program
aggregates those two (size code 3 in four passes, p4/README.md).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import conformance  # noqa: E402  (tests/conformance.py: the vectors' loader and builder)

try:  # P4 Studio's test framework; absent everywhere but a switch or model host
    import bfrt_grpc.client as gc
    import ptf.testutils as testutils
    from ptf.base_tests import BaseTest
    from scapy.all import IP, UDP, Ether, Raw

    HAVE_PTF = True
except ImportError:  # pragma: no cover - imported for documentation or linting only
    HAVE_PTF = False
    BaseTest = object

ACTION_CODES = {name: i for i, name in enumerate(conformance.ACTIONS)}  # = swemu Action values
RID_WORKER_BITS = 5  # rid = job_id << 5 | rank (p4/result.p4)
#: Register entries of the shared pool per slot, per size code the program aggregates
#: (p4/checks.p4; = p4.controller.bfrt_target.ENTRIES_PER_SLOT, checked by
#: tests/test_p4_bfrt_names.py).
ENTRIES_PER_SLOT = {1: 1, 3: 4}


def worker_mac(ip: int) -> str:
    """A locally administered MAC derived from a worker's IPv4 address."""
    return "02:00:" + ":".join(f"{(ip >> s) & 0xFF:02x}" for s in (24, 16, 8, 0))


def ip_str(ip: int) -> str:
    return ".".join(str((ip >> s) & 0xFF) for s in (24, 16, 8, 0))


class Registrations:
    """The control-plane view of docs/protocol.md §5: jobs, their workers' addresses, and
    which address belongs to whom (registering an address again moves it)."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}  # session_id -> job
        self.owner: dict[tuple[int, int], tuple[int, int]] = {}  # (ip, port) -> (session, rank)
        self.next_pool_base = 0  # pools are never reused within a vector: no stale state

    def register(self, reg: conformance.Registration) -> None:
        if reg.rank == 0:
            old = self.jobs.pop(reg.session_id, None)
            if old is not None:
                for addr in old["workers"].values():
                    self.owner.pop(addr, None)
            self.jobs[reg.session_id] = {
                "job_id": self.next_job_id(),
                "num_workers": reg.num_workers,
                "size_code": reg.size_code,
                "pool_size": reg.pool_size,
                "value_formats": reg.value_formats,
                "pool_base": self.next_pool_base,
                "workers": {},
            }
            self.next_pool_base += reg.pool_size * ENTRIES_PER_SLOT[reg.size_code]
        job = self.jobs[reg.session_id]
        addr = (reg.ipv4, reg.udp_port)
        previous_owner = self.owner.get(addr)
        if previous_owner is not None:
            self.jobs[previous_owner[0]]["workers"].pop(previous_owner[1], None)
        previous_addr = job["workers"].get(reg.rank)
        if previous_addr is not None:
            self.owner.pop(previous_addr, None)
        job["workers"][reg.rank] = addr
        self.owner[addr] = (reg.session_id, reg.rank)

    def next_job_id(self) -> int:
        used = {j["job_id"] for j in self.jobs.values()}
        return min(set(range(1, 256)) - used)

    def job_of(self, ip: int, port: int) -> int:
        """The job_id a packet from (ip, port) is counted under; 0 if unknown."""
        who = self.owner.get((ip, port)) or self.owner.get((ip, 0))
        return self.jobs[who[0]]["job_id"] if who else 0


class SwitchMLVectors(BaseTest):
    """Every hardware-sized vector, in one test: program, send, verify, clean up."""

    def setUp(self) -> None:
        BaseTest.setUp(self)
        self.p4_name = testutils.test_param_get("p4_name", "switchml")
        self.interface = gc.ClientInterface(
            testutils.test_param_get("grpc_addr", "localhost:50052"), client_id=0, device_id=0
        )
        self.bfrt_info = self.interface.bfrt_info_get(self.p4_name)
        self.interface.bind_pipeline_config(self.p4_name)
        self.target = gc.Target(device_id=0, pipe_id=0xFFFF)
        self.switch_mac = testutils.test_param_get("switch_mac", "02:00:00:00:00:fe")
        self.check_actions = testutils.test_param_get("check_actions", "1") == "1"
        spec = testutils.test_param_get("ports", "")
        self.fixed_ports = {
            conformance.ip_to_int(ip): int(port)
            for ip, port in (item.split("=") for item in spec.split(",") if item)
        }

    def tearDown(self) -> None:
        self.clear_tables()
        self.interface.tear_down_stream()
        BaseTest.tearDown(self)

    # ------------------------------------------------------------------ tables
    def table(self, name: str) -> Any:
        return self.bfrt_info.table_get(name)

    def clear_tables(self) -> None:
        for name in (
            "worker_by_address",
            "worker_by_ip",
            "worker_address",
            "arp_icmp",
            "$pre.mgid",
            "$pre.node",
        ):
            t = self.table(name)
            keys = [key for _, key in t.entry_get(self.target, [], {"from_hw": False})]
            if keys:
                t.entry_del(self.target, keys)

    def zero_registers(self) -> None:
        """Bitmaps and counts must start at 0 (values and exponents are written on first
        use, so they need no reset). Writes 0 to every data field of every index."""
        for name in ("worker_bitmap", "count"):
            t = self.table(name)
            fields = t.info.data_field_name_list_get()
            size = t.info.size_get()
            keys = [t.make_key([gc.KeyTuple("$REGISTER_INDEX", i)]) for i in range(size)]
            data = [t.make_data([gc.DataTuple(f, 0) for f in fields])] * size
            t.entry_mod(self.target, keys, data)

    def program(self, regs: Registrations, vector: dict[str, Any]) -> None:
        """Install the switch's address and every registration (§5) as table entries."""
        self.clear_tables()
        switch_ip = conformance.ip_to_int(vector["switch"]["ip"])
        arp = self.table("arp_icmp")
        arp.entry_add(
            self.target,
            [
                arp.make_key(
                    [
                        gc.KeyTuple("hdr.arp.$valid", True),
                        gc.KeyTuple("hdr.arp.opcode", 1, 0xFFFF),
                        gc.KeyTuple("hdr.arp.target_proto_addr", switch_ip, 0xFFFFFFFF),
                        gc.KeyTuple("hdr.icmp.$valid", False),
                        gc.KeyTuple("hdr.icmp.msg_type", 0, 0),
                        gc.KeyTuple("hdr.ipv4.dst_addr", 0, 0),
                    ]
                )
            ],
            [
                arp.make_data(
                    [gc.DataTuple("switch_mac", gc.mac_to_bytes(self.switch_mac))],
                    "Ingress.arp_icmp.reply_arp",
                )
            ],
        )
        by_addr, by_ip = self.table("worker_by_address"), self.table("worker_by_ip")
        rewrite, node, mgid = (
            self.table("worker_address"),
            self.table("$pre.node"),
            self.table("$pre.mgid"),
        )
        for job in regs.jobs.values():
            job_id = job["job_id"]
            nodes = []
            for rank, (ip, port) in sorted(job["workers"].items()):
                data = by_addr.make_data(
                    [
                        gc.DataTuple("job_id", job_id),
                        gc.DataTuple("worker_id", rank),
                        gc.DataTuple("worker_bit", 1 << rank),
                        gc.DataTuple("num_workers", job["num_workers"]),
                        gc.DataTuple("size_code", job["size_code"]),
                        gc.DataTuple("pool_base", job["pool_base"]),
                        gc.DataTuple("pool_size", job["pool_size"]),
                        gc.DataTuple("mgid", job_id),
                        gc.DataTuple("value_formats", job["value_formats"]),
                    ],
                    "Ingress.worker_lookup.set_worker",
                )
                if port:
                    key = by_addr.make_key(
                        [
                            gc.KeyTuple("hdr.ipv4.src_addr", ip),
                            gc.KeyTuple("hdr.udp.src_port", port),
                        ]
                    )
                    by_addr.entry_add(self.target, [key], [data])
                else:
                    key = by_ip.make_key([gc.KeyTuple("hdr.ipv4.src_addr", ip)])
                    by_ip.entry_add(self.target, [key], [data])
                rid = job_id << RID_WORKER_BITS | rank
                mac = gc.mac_to_bytes(worker_mac(ip))
                if port:
                    rw = rewrite.make_data(
                        [
                            gc.DataTuple("mac", mac),
                            gc.DataTuple("ip", ip),
                            gc.DataTuple("udp_port", port),
                        ],
                        "Egress.rewrite_result.to_worker",
                    )
                else:
                    rw = rewrite.make_data(
                        [gc.DataTuple("mac", mac), gc.DataTuple("ip", ip)],
                        "Egress.rewrite_result.to_worker_by_ip",
                    )
                rewrite.entry_add(
                    self.target,
                    [rewrite.make_key([gc.KeyTuple("eg_intr_md.egress_rid", rid)])],
                    [rw],
                )
                node.entry_add(
                    self.target,
                    [node.make_key([gc.KeyTuple("$MULTICAST_NODE_ID", rid)])],
                    [
                        node.make_data(
                            [
                                gc.DataTuple("$MULTICAST_RID", rid),
                                gc.DataTuple("$MULTICAST_LAG_ID", int_arr_val=[]),
                                gc.DataTuple("$DEV_PORT", int_arr_val=[self.port_of(ip)]),
                            ]
                        )
                    ],
                )
                nodes.append(rid)
            mgid.entry_add(
                self.target,
                [mgid.make_key([gc.KeyTuple("$MGID", job_id)])],
                [
                    mgid.make_data(
                        [
                            gc.DataTuple("$MULTICAST_NODE_ID", int_arr_val=nodes),
                            gc.DataTuple(
                                "$MULTICAST_NODE_L1_XID_VALID", bool_arr_val=[False] * len(nodes)
                            ),
                            gc.DataTuple("$MULTICAST_NODE_L1_XID", int_arr_val=[0] * len(nodes)),
                        ]
                    )
                ],
            )

    def action_count(self, job_id: int, action: str) -> int:
        t = self.table("action_counter")
        index = job_id << 3 | ACTION_CODES[action]
        key = t.make_key([gc.KeyTuple("$COUNTER_INDEX", index)])
        for data, _ in t.entry_get(self.target, [key], {"from_hw": True}):
            return data.to_dict()["$COUNTER_SPEC_PKTS"]
        return 0

    # ------------------------------------------------------------------ frames
    def port_of(self, ip: int) -> int:
        if ip not in self.ports:
            if ip in self.fixed_ports:
                self.ports[ip] = self.fixed_ports[ip]
            else:
                free = sorted(set(self.dataplane_ports) - set(self.ports.values()))
                self.ports[ip] = free[0]
        return self.ports[ip]

    def frame_in(self, vector: dict[str, Any], src: str, payload: bytes) -> Any:
        ip, port = conformance.parse_addr(src)
        sw = vector["switch"]
        return (
            Ether(src=worker_mac(ip), dst=self.switch_mac)
            / IP(src=ip_str(ip), dst=sw["ip"], ttl=64, id=0, flags=0)
            / UDP(sport=port, dport=sw["udp_port"], chksum=0)
            / Raw(payload)
        )

    def frame_out(self, vector: dict[str, Any], to: str, payload: bytes) -> Any:
        ip, port = conformance.parse_addr(to)
        sw = vector["switch"]
        return (
            Ether(src=self.switch_mac, dst=worker_mac(ip))
            / IP(src=sw["ip"], dst=ip_str(ip), ttl=64, id=0, flags=0)
            / UDP(sport=sw["udp_port"], dport=port, chksum=0)
            / Raw(payload)
        )

    # ------------------------------------------------------------------ run
    def runTest(self) -> None:  # PTF calls this name
        directory = testutils.test_param_get("vectors", str(conformance.VECTORS_DIR))
        only = {n for n in testutils.test_param_get("only", "").split(",") if n}
        self.dataplane_ports = sorted(p for _, p in self.dataplane.ports)
        for vector in conformance.load_vectors(directory):
            if only and vector["name"] not in only:
                continue
            if any(j["size_code"] not in ENTRIES_PER_SLOT for j in vector["jobs"]):
                print(f"skip {vector['name']}: size code other than 1 and 3")
                continue
            print(f"vector {vector['name']}")
            self.run_vector(vector)

    def run_vector(self, vector: dict[str, Any]) -> None:
        self.ports: dict[int, int] = {}
        regs = Registrations()
        for reg in conformance.initial_registrations(vector):
            regs.register(reg)
        self.zero_registers()
        self.program(regs, vector)
        for i, step in enumerate(vector["steps"]):
            if "register" in step:
                regs.register(conformance.step_registration(step))
                self.program(regs, vector)
                continue
            ip, port = conformance.parse_addr(step["from"])
            job_id = regs.job_of(ip, port)
            action = step["expect"]["action"]
            before = self.action_count(job_id, action) if self.check_actions else 0
            frame = self.frame_in(vector, step["from"], conformance.step_datagram(step))
            testutils.send_packet(self, self.port_of(ip), frame)
            for to, payload in conformance.expected_outputs(step):
                to_ip, _ = conformance.parse_addr(to)
                testutils.verify_packet(
                    self, self.frame_out(vector, to, payload), self.port_of(to_ip)
                )
            testutils.verify_no_other_packets(self)
            if self.check_actions:
                after = self.action_count(job_id, action)
                self.assertEqual(after, before + 1, f"{vector['file']} step {i}: {action}")
