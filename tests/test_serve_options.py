"""``serve`` options a raw-frame client (p4app-switchML's DPDK backend) needs.

- ``--advertise-mac``: the MAC in the UdpSession reply, where such a client sends
  its frames; by default that of the interface holding ``--host``.
- ``--no-gso``: results leave one datagram per frame. With segmentation offload a
  virtual link (veth, loopback) hands a packet socket the whole super-frame, and a
  client that reads frames sees one 16 KiB frame instead of 16 datagrams.
- the ports are bound only once every kernel is compiled (``--ready-file`` says
  when the emulator serves).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess

import grpc
import numpy as np
import pytest
from click.testing import CliRunner

import swemu
from cli.serve import serve
from swemu.launch import EmulatorProcess
from swemu.protocol import fastio, wire
from swemu.protocol.netutil import format_mac, interface_mac, mac_of_ipv4, parse_mac
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc
from swemu.serving import server

DEFAULT_MAC = wire.DEFAULT_SWITCH_MAC


def test_parse_and_format_mac():
    assert parse_mac("02:11:22:33:44:55") == 0x021122334455
    assert parse_mac("2-11-22-33-44-5") == 0x021122334405
    assert format_mac(0x021122334455) == "02:11:22:33:44:55"
    assert format_mac(DEFAULT_MAC) == "02:00:5e:be:e0:00"
    for bad in ("", "02:11:22:33:44", "02:11:22:33:44:55:66", "zz:11:22:33:44:55", "0211.2233"):
        with pytest.raises(ValueError, match="not a MAC address"):
            parse_mac(bad)


def test_bad_advertise_mac_is_one_clear_line():
    res = CliRunner().invoke(serve, ["--advertise-mac", "02:11:22"], catch_exceptions=False)
    assert res.exit_code == 2
    assert "not a MAC address" in res.output


def test_default_mac_is_the_interface_s():
    # loopback and wildcard addresses have no MAC: the fixed default
    assert interface_mac("127.0.0.1") == DEFAULT_MAC
    assert interface_mac("0.0.0.0") == DEFAULT_MAC
    assert interface_mac("0.0.0.0", "127.0.0.1") == DEFAULT_MAC
    if shutil.which("ip") is None:
        pytest.skip("no `ip` to list this host's addresses")
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        name, ip = line.split()[1], line.split()[3].split("/")[0]
        try:
            with open(f"/sys/class/net/{name}/address") as f:
                mac = int(f.read().strip().replace(":", ""), 16)
        except OSError:
            continue
        if mac and mac_of_ipv4(ip):  # a primary address of an interface with a MAC
            assert interface_mac(ip) == mac
            assert interface_mac("0.0.0.0", ip) == mac
            return
    pytest.skip("no interface with a MAC holds an IPv4 address here")


def test_advertise_mac_is_in_the_reply():
    with (
        EmulatorProcess("--advertise-mac", "02:11:22:33:44:55") as emu,
        grpc.insecure_channel(emu.control) as ch,
    ):
        resp = pb_grpc.SessionStub(ch).UdpSession(
            pb.UdpSessionRequest(
                session_id=5, rank=0, num_workers=1, ipv4=0x7F000001, udp_port=9, packet_size=3
            ),
            timeout=30,
        )
    assert resp.mac == 0x021122334455
    assert resp.ipv4 == 0x7F000001


async def test_in_process_default_mac_on_loopback():
    async with swemu.serve() as emu:
        assert emu.switch_mac == DEFAULT_MAC


async def test_ports_are_bound_only_after_the_kernels_are_compiled(monkeypatch):
    order = []
    real_warmup, real_bind = server.dataplane_warmup, server.bind_udp
    real_control = server.start_control_server

    def warmup(loop, **kwargs):
        order.append("compile")
        real_warmup(loop, **kwargs)

    def bind(host, port):
        order.append("bind udp")
        return real_bind(host, port)

    async def control(*args, **kwargs):
        order.append("bind grpc")
        return await real_control(*args, **kwargs)

    monkeypatch.setattr(server, "dataplane_warmup", warmup)
    monkeypatch.setattr(server, "bind_udp", bind)
    monkeypatch.setattr(server, "start_control_server", control)
    async with swemu.serve():
        pass
    assert order == ["compile", "bind udp", "bind grpc"]


def _udp_frames(sniffer: socket.socket, src_port: int) -> list[int]:
    """Lengths of the UDP payloads (datagram bytes) of the frames from ``src_port``."""
    sizes = []
    while True:
        try:
            frame = sniffer.recv(1 << 17)
        except BlockingIOError:
            return sizes
        ip = frame[14:]  # loopback frames carry a (zero) Ethernet header
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_UDP:
            continue
        ihl = (ip[0] & 0xF) * 4
        sport = struct.unpack("!H", ip[ihl : ihl + 2])[0]
        if sport == src_port:
            sizes.append(len(ip) - ihl - 8)


@pytest.mark.parametrize("gso", [True, False])
async def test_no_gso_sends_one_datagram_per_frame(gso):
    """What a packet socket on the link sees: the frame a DPDK af_packet client reads."""
    if os.geteuid() != 0:
        pytest.skip("a packet socket needs root (CAP_NET_RAW)")
    if gso and not (fastio.AVAILABLE and fastio.gso_available()):
        pytest.skip("no UDP segmentation offload here")
    code, k = 3, 16
    plen = wire.packet_len(code)
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
    try:
        sniffer.bind(("lo", 0))
        sniffer.setblocking(False)
        async with swemu.serve(gso=gso) as emu:
            worker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            worker.bind(("127.0.0.1", 0))
            worker.setblocking(False)
            emu.engine.register(
                session_id=1,
                rank=0,
                num_workers=1,
                ipv4=0x7F000001,
                udp_port=worker.getsockname()[1],
                packet_size=code,
                pool_size=k,
            )
            values = np.arange(wire.values_per_packet(code), dtype=np.int32)
            for slot in range(k):  # all queued before the emulator's loop runs: one batch
                pkt = wire.encode(
                    size_code=code, job_number=0, tsi=slot, set=0, slot=slot, values=values
                )
                worker.sendto(pkt, emu.data_address)
            got = 0
            for _ in range(500):
                await asyncio.sleep(0.01)
                try:
                    while worker.recv(65536):
                        got += 1
                except BlockingIOError:
                    pass
                if got == k:
                    break
            worker.close()
            assert got == k
            sizes = _udp_frames(sniffer, emu.port)
    finally:
        sniffer.close()
    assert sizes and sum(sizes) >= k * plen  # each result seen (twice on loopback)
    if gso:
        assert max(sizes) > plen  # several datagrams in one frame
    else:
        assert set(sizes) == {plen}
