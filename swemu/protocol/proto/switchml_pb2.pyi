from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerIdentity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IDENTITY_UNKNOWN: _ClassVar[WorkerIdentity]
    IDENTITY_IP_PORT: _ClassVar[WorkerIdentity]
    IDENTITY_IP: _ClassVar[WorkerIdentity]

class ValueFormats(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUES_INT32: _ClassVar[ValueFormats]
    VALUES_INT32_AND_BLOCK16: _ClassVar[ValueFormats]

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
IDENTITY_UNKNOWN: WorkerIdentity
IDENTITY_IP_PORT: WorkerIdentity
IDENTITY_IP: WorkerIdentity
VALUES_INT32: ValueFormats
VALUES_INT32_AND_BLOCK16: ValueFormats
MTU_128: PacketSize
MTU_256: PacketSize
MTU_512: PacketSize
MTU_1024: PacketSize
EMU_2048: PacketSize
EMU_4096: PacketSize
EMU_8192: PacketSize
EMU_16384: PacketSize

class RdmaSessionRequest(_message.Message):
    __slots__ = ("session_id", "rank", "num_workers", "mac", "ipv4", "rkey", "packet_size", "message_size", "qpns", "psns")
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
    def __init__(self, session_id: _Optional[int] = ..., rank: _Optional[int] = ..., num_workers: _Optional[int] = ..., mac: _Optional[int] = ..., ipv4: _Optional[int] = ..., rkey: _Optional[int] = ..., packet_size: _Optional[_Union[PacketSize, str]] = ..., message_size: _Optional[int] = ..., qpns: _Optional[_Iterable[int]] = ..., psns: _Optional[_Iterable[int]] = ...) -> None: ...

class RdmaSessionResponse(_message.Message):
    __slots__ = ("session_id", "mac", "ipv4", "rkeys", "qpns", "psns")
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
    def __init__(self, session_id: _Optional[int] = ..., mac: _Optional[int] = ..., ipv4: _Optional[int] = ..., rkeys: _Optional[_Iterable[int]] = ..., qpns: _Optional[_Iterable[int]] = ..., psns: _Optional[_Iterable[int]] = ...) -> None: ...

class UdpSessionRequest(_message.Message):
    __slots__ = ("session_id", "rank", "num_workers", "mac", "ipv4", "packet_size", "udp_port", "pool_size", "loopback_broadcast", "value_formats")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    PACKET_SIZE_FIELD_NUMBER: _ClassVar[int]
    UDP_PORT_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOOPBACK_BROADCAST_FIELD_NUMBER: _ClassVar[int]
    VALUE_FORMATS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    rank: int
    num_workers: int
    mac: int
    ipv4: int
    packet_size: PacketSize
    udp_port: int
    pool_size: int
    loopback_broadcast: bool
    value_formats: ValueFormats
    def __init__(self, session_id: _Optional[int] = ..., rank: _Optional[int] = ..., num_workers: _Optional[int] = ..., mac: _Optional[int] = ..., ipv4: _Optional[int] = ..., packet_size: _Optional[_Union[PacketSize, str]] = ..., udp_port: _Optional[int] = ..., pool_size: _Optional[int] = ..., loopback_broadcast: _Optional[bool] = ..., value_formats: _Optional[_Union[ValueFormats, str]] = ...) -> None: ...

class UdpSessionResponse(_message.Message):
    __slots__ = ("session_id", "mac", "ipv4", "data_ports", "broadcast_port", "emulator", "worker_identity", "instance", "epoch", "value_formats")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    DATA_PORTS_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_PORT_FIELD_NUMBER: _ClassVar[int]
    EMULATOR_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    VALUE_FORMATS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    mac: int
    ipv4: int
    data_ports: _containers.RepeatedScalarFieldContainer[int]
    broadcast_port: int
    emulator: EmulatorInfo
    worker_identity: WorkerIdentity
    instance: int
    epoch: int
    value_formats: ValueFormats
    def __init__(self, session_id: _Optional[int] = ..., mac: _Optional[int] = ..., ipv4: _Optional[int] = ..., data_ports: _Optional[_Iterable[int]] = ..., broadcast_port: _Optional[int] = ..., emulator: _Optional[_Union[EmulatorInfo, _Mapping]] = ..., worker_identity: _Optional[_Union[WorkerIdentity, str]] = ..., instance: _Optional[int] = ..., epoch: _Optional[int] = ..., value_formats: _Optional[_Union[ValueFormats, str]] = ...) -> None: ...

class EmulatorInfo(_message.Message):
    __slots__ = ("packet_size",)
    PACKET_SIZE_FIELD_NUMBER: _ClassVar[int]
    packet_size: PacketSize
    def __init__(self, packet_size: _Optional[_Union[PacketSize, str]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "rank", "ipv4", "udp_port")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    UDP_PORT_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    rank: int
    ipv4: int
    udp_port: int
    def __init__(self, session_id: _Optional[int] = ..., rank: _Optional[int] = ..., ipv4: _Optional[int] = ..., udp_port: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("freed", "remaining", "found")
    FREED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    freed: bool
    remaining: int
    found: bool
    def __init__(self, freed: _Optional[bool] = ..., remaining: _Optional[int] = ..., found: _Optional[bool] = ...) -> None: ...

class SwitchInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BarrierRequest(_message.Message):
    __slots__ = ("num_workers", "session_id")
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    num_workers: int
    session_id: int
    def __init__(self, num_workers: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class BarrierResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BroadcastRequest(_message.Message):
    __slots__ = ("value", "rank", "num_workers", "root", "session_id")
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
    def __init__(self, value: _Optional[int] = ..., rank: _Optional[int] = ..., num_workers: _Optional[int] = ..., root: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class BroadcastResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("session_id", "rank")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    rank: int
    def __init__(self, session_id: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("instance", "known", "epoch")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    instance: int
    known: bool
    epoch: int
    def __init__(self, instance: _Optional[int] = ..., known: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class SlotResult(_message.Message):
    __slots__ = ("slot", "round", "tsi", "set", "job_number", "e0", "values")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TSI_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    JOB_NUMBER_FIELD_NUMBER: _ClassVar[int]
    E0_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    slot: int
    round: int
    tsi: int
    set: int
    job_number: int
    e0: int
    values: bytes
    def __init__(self, slot: _Optional[int] = ..., round: _Optional[int] = ..., tsi: _Optional[int] = ..., set: _Optional[int] = ..., job_number: _Optional[int] = ..., e0: _Optional[int] = ..., values: _Optional[bytes] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("registration", "rounds", "last")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    registration: UdpSessionRequest
    rounds: _containers.RepeatedScalarFieldContainer[int]
    last: _containers.RepeatedCompositeFieldContainer[SlotResult]
    def __init__(self, registration: _Optional[_Union[UdpSessionRequest, _Mapping]] = ..., rounds: _Optional[_Iterable[int]] = ..., last: _Optional[_Iterable[_Union[SlotResult, _Mapping]]] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("registration", "repairs")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    registration: UdpSessionResponse
    repairs: _containers.RepeatedCompositeFieldContainer[SlotResult]
    def __init__(self, registration: _Optional[_Union[UdpSessionResponse, _Mapping]] = ..., repairs: _Optional[_Iterable[_Union[SlotResult, _Mapping]]] = ...) -> None: ...
