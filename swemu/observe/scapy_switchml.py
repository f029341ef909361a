"""A scapy layer for SwitchML/UDP packets (docs/protocol.md §1).

Licence note: scapy is GPL-2.0. This module imports it, so it is imported only
when the user has installed the ``capture`` extra (``pip install
switchml-emu[capture]``); the core (the switch, the host library, the pcap
writer and decoder in :mod:`swemu.observe.pcap` / :mod:`swemu.observe.decode`) never imports
it, and nothing in this package imports this module.

``fields_desc`` mirrors the header bit for bit, in the order the P4 program's
``switchml_h`` declares it; ``pool_index`` is dissected into its ``set``,
reserved bit and ``slot`` so that a capture shows the shadow copy at a glance.
The values are ``32 << size`` big-endian int32 words. Building does not pad or
cut ``values`` to the size code: a wrong length gives a malformed packet,
which is what a test of the switch's drop rules wants.

Usage::

    from swemu.observe.scapy_switchml import SwitchML, switchml_packets
    pkt = IP(dst="10.0.0.100") / UDP(sport=40000) / SwitchML(size=0, tsi=7, values=[1] * 32)
    for sw in switchml_packets("capture.pcap"):
        print(sw.slot, sw.set, sw.tsi)
"""

from __future__ import annotations

import struct
from os import PathLike
from typing import Any

from scapy.fields import (
    BitField,
    ByteField,
    FieldListField,
    IntField,
    SignedByteField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_bottom_up, bind_layers
from scapy.utils import rdpcap

from swemu.protocol.wire import MAX_VALUES, MSG_TYPE, UDP_PORT_BASE

SWITCHML_PORTS = range(UDP_PORT_BASE, UDP_PORT_BASE + 16)  # port & 0xFFF0 == 0xBEE0


def _value_count(pkt: Packet) -> int:
    # the size code fixes the number of values; dissection stops there, so any
    # extra bytes of a malformed datagram show up as a Raw payload
    return 32 << (pkt.size & 0x7)


class _ValuesField(FieldListField):
    """``count_from`` values, or as many whole words as a short datagram holds.

    Unpacks with one ``struct`` call instead of one field call per value (a
    size-7 packet has 4096), and stops at the end of a truncated datagram
    instead of raising, so a malformed packet still dissects.
    """

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, list[int]]:
        n = min(self.count_from(pkt), len(s) // 4)
        return s[4 * n :], list(struct.unpack(f"!{n}i", s[: 4 * n]))


class SwitchML(Packet):
    """SwitchML header and values; ``set``/``reserved``/``slot`` form ``pool_index``."""

    name = "SwitchML"
    fields_desc = [  # noqa: RUF012 (scapy's declarative field list)
        BitField("msg_type", MSG_TYPE, 4),
        BitField("unused", 0, 1),
        BitField("size", 1, 3),
        ByteField("job_number", 0),
        IntField("tsi", 0),
        BitField("set", 0, 1),  # pool_index bit 15: the shadow copy
        BitField("reserved", 0, 1),  # pool_index bit 14
        BitField("slot", 0, 14),  # pool_index bits 13..0
        SignedByteField("e0", 0),
        SignedByteField("e1", 0),
        _ValuesField(
            "values", [], SignedIntField("value", 0), count_from=_value_count, max_count=MAX_VALUES
        ),
    ]

    @property
    def pool_index(self) -> int:
        """The 16-bit pool_index field as it is on the wire."""
        return (self.set << 15) | (self.reserved << 14) | self.slot

    def mysummary(self) -> str:
        return self.sprintf("SwitchML job=%job_number% tsi=%tsi% slot=%slot% set=%set% size=%size%")

    def hashret(self) -> bytes:
        # a result echoes the slot, set and tsi of the packet that triggered it
        return struct.pack("!HI", self.pool_index, self.tsi)

    def answers(self, other: Any) -> int:
        if not isinstance(other, SwitchML):
            return 0
        same = ("slot", "set", "tsi", "job_number", "size")
        return int(all(getattr(self, f) == getattr(other, f) for f in same))


def switchml_packets(pcap_path: str | PathLike[str]) -> list[SwitchML]:
    """The SwitchML layers of every packet of a capture, read with scapy's rdpcap."""
    return [pkt[SwitchML] for pkt in rdpcap(str(pcap_path)) if SwitchML in pkt]


# Dissect a datagram to or from any of the switch's 16 ports (workers send to
# them, results come back from them); building UDP()/SwitchML() fills in the
# default port 0xBEE0 as the destination.
for _port in SWITCHML_PORTS:
    bind_bottom_up(UDP, SwitchML, dport=_port)
    bind_bottom_up(UDP, SwitchML, sport=_port)
bind_layers(UDP, SwitchML, dport=UDP_PORT_BASE)
del _port
