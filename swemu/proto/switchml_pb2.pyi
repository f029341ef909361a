from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

DESCRIPTOR: _descriptor.FileDescriptor

class PacketSize(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MTU_128: _ClassVar[PacketSize]
    MTU_256: _ClassVar[PacketSize]
    MTU_512: _ClassVar[PacketSize]
    MTU_1024: _ClassVar[PacketSize]
    EMU_2048: _ClassVar[PacketSize]
    EMU_4096: _ClassVar[PacketSize]
    EMU_8192: _ClassVar[PacketSize]
    EMU_16384: _ClassVar[PacketSize]

MTU_128: PacketSize
MTU_256: PacketSize
MTU_512: PacketSize
MTU_1024: PacketSize
EMU_2048: PacketSize
EMU_4096: PacketSize
EMU_8192: PacketSize
EMU_16384: PacketSize

class RdmaSessionRequest(_message.Message):
    __slots__ = (
        "ipv4",
        "mac",
        "message_size",
        "num_workers",
        "packet_size",
        "psns",
        "qpns",
        "rank",
        "rkey",
        "session_id",
    )
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    RKEY_FIELD_NUMBER: _ClassVar[int]
    PACKET_SIZE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    QPNS_FIELD_NUMBER: _ClassVar[int]
    PSNS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    rank: int
    num_workers: int
    mac: int
    ipv4: int
    rkey: int
    packet_size: PacketSize
    message_size: int
    qpns: _containers.RepeatedScalarFieldContainer[int]
    psns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self,
        session_id: int | None = ...,
        rank: int | None = ...,
        num_workers: int | None = ...,
        mac: int | None = ...,
        ipv4: int | None = ...,
        rkey: int | None = ...,
        packet_size: PacketSize | str | None = ...,
        message_size: int | None = ...,
        qpns: _Iterable[int] | None = ...,
        psns: _Iterable[int] | None = ...,
    ) -> None: ...

class RdmaSessionResponse(_message.Message):
    __slots__ = ("ipv4", "mac", "psns", "qpns", "rkeys", "session_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    RKEYS_FIELD_NUMBER: _ClassVar[int]
    QPNS_FIELD_NUMBER: _ClassVar[int]
    PSNS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    mac: int
    ipv4: int
    rkeys: _containers.RepeatedScalarFieldContainer[int]
    qpns: _containers.RepeatedScalarFieldContainer[int]
    psns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self,
        session_id: int | None = ...,
        mac: int | None = ...,
        ipv4: int | None = ...,
        rkeys: _Iterable[int] | None = ...,
        qpns: _Iterable[int] | None = ...,
        psns: _Iterable[int] | None = ...,
    ) -> None: ...

class UdpSessionRequest(_message.Message):
    __slots__ = (
        "ipv4",
        "mac",
        "num_workers",
        "packet_size",
        "pool_size",
        "rank",
        "session_id",
        "udp_port",
    )
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    PACKET_SIZE_FIELD_NUMBER: _ClassVar[int]
    UDP_PORT_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    rank: int
    num_workers: int
    mac: int
    ipv4: int
    packet_size: PacketSize
    udp_port: int
    pool_size: int
    def __init__(
        self,
        session_id: int | None = ...,
        rank: int | None = ...,
        num_workers: int | None = ...,
        mac: int | None = ...,
        ipv4: int | None = ...,
        packet_size: PacketSize | str | None = ...,
        udp_port: int | None = ...,
        pool_size: int | None = ...,
    ) -> None: ...

class UdpSessionResponse(_message.Message):
    __slots__ = ("data_ports", "ipv4", "mac", "session_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    DATA_PORTS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    mac: int
    ipv4: int
    data_ports: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self,
        session_id: int | None = ...,
        mac: int | None = ...,
        ipv4: int | None = ...,
        data_ports: _Iterable[int] | None = ...,
    ) -> None: ...

class BarrierRequest(_message.Message):
    __slots__ = ("num_workers", "session_id")
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    num_workers: int
    session_id: int
    def __init__(self, num_workers: int | None = ..., session_id: int | None = ...) -> None: ...

class BarrierResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BroadcastRequest(_message.Message):
    __slots__ = ("num_workers", "rank", "root", "session_id", "value")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    value: int
    rank: int
    num_workers: int
    root: int
    session_id: int
    def __init__(
        self,
        value: int | None = ...,
        rank: int | None = ...,
        num_workers: int | None = ...,
        root: int | None = ...,
        session_id: int | None = ...,
    ) -> None: ...

class BroadcastResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: int | None = ...) -> None: ...
