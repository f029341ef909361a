import switchml_pb2 as _switchml_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hop(_message.Message):
    __slots__ = ("switch", "data_ipv4", "data_port", "uplink_ipv4", "uplink_port", "always_up", "control")
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    DATA_IPV4_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    UPLINK_IPV4_FIELD_NUMBER: _ClassVar[int]
    UPLINK_PORT_FIELD_NUMBER: _ClassVar[int]
    ALWAYS_UP_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    switch: int
    data_ipv4: int
    data_port: int
    uplink_ipv4: int
    uplink_port: int
    always_up: bool
    control: str
    def __init__(self, switch: _Optional[int] = ..., data_ipv4: _Optional[int] = ..., data_port: _Optional[int] = ..., uplink_ipv4: _Optional[int] = ..., uplink_port: _Optional[int] = ..., always_up: _Optional[bool] = ..., control: _Optional[str] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("instance", "control")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    instance: int
    control: str
    def __init__(self, instance: _Optional[int] = ..., control: _Optional[str] = ...) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("instance", "data_ipv4", "data_port")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DATA_IPV4_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    instance: int
    data_ipv4: int
    data_port: int
    def __init__(self, instance: _Optional[int] = ..., data_ipv4: _Optional[int] = ..., data_port: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("registration", "path")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    registration: _switchml_pb2.UdpSessionRequest
    path: _containers.RepeatedCompositeFieldContainer[Hop]
    def __init__(self, registration: _Optional[_Union[_switchml_pb2.UdpSessionRequest, _Mapping]] = ..., path: _Optional[_Iterable[_Union[Hop, _Mapping]]] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class FabricResumeRequest(_message.Message):
    __slots__ = ("report", "path")
    REPORT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    report: _switchml_pb2.ResumeRequest
    path: _containers.RepeatedCompositeFieldContainer[Hop]
    def __init__(self, report: _Optional[_Union[_switchml_pb2.ResumeRequest, _Mapping]] = ..., path: _Optional[_Iterable[_Union[Hop, _Mapping]]] = ...) -> None: ...

class GoneRequest(_message.Message):
    __slots__ = ("session_id", "why")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    why: str
    def __init__(self, session_id: _Optional[int] = ..., why: _Optional[str] = ...) -> None: ...

class GoneResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Member(_message.Message):
    __slots__ = ("rank", "child", "ipv4", "udp_port", "mac", "loopback_broadcast")
    RANK_FIELD_NUMBER: _ClassVar[int]
    CHILD_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    UDP_PORT_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    LOOPBACK_BROADCAST_FIELD_NUMBER: _ClassVar[int]
    rank: int
    child: int
    ipv4: int
    udp_port: int
    mac: int
    loopback_broadcast: bool
    def __init__(self, rank: _Optional[int] = ..., child: _Optional[int] = ..., ipv4: _Optional[int] = ..., udp_port: _Optional[int] = ..., mac: _Optional[int] = ..., loopback_broadcast: _Optional[bool] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("switch", "involved", "members", "parent_ipv4", "parent_port", "below")
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    INVOLVED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PARENT_IPV4_FIELD_NUMBER: _ClassVar[int]
    PARENT_PORT_FIELD_NUMBER: _ClassVar[int]
    BELOW_FIELD_NUMBER: _ClassVar[int]
    switch: int
    involved: bool
    members: _containers.RepeatedCompositeFieldContainer[Member]
    parent_ipv4: int
    parent_port: int
    below: _containers.RepeatedCompositeFieldContainer[Plan]
    def __init__(self, switch: _Optional[int] = ..., involved: _Optional[bool] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., parent_ipv4: _Optional[int] = ..., parent_port: _Optional[int] = ..., below: _Optional[_Iterable[_Union[Plan, _Mapping]]] = ...) -> None: ...

class ConfigureRequest(_message.Message):
    __slots__ = ("session_id", "num_workers", "packet_size", "pool_size", "epoch", "plan", "value_formats")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PACKET_SIZE_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FORMATS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    num_workers: int
    packet_size: int
    pool_size: int
    epoch: int
    plan: Plan
    value_formats: int
    def __init__(self, session_id: _Optional[int] = ..., num_workers: _Optional[int] = ..., packet_size: _Optional[int] = ..., pool_size: _Optional[int] = ..., epoch: _Optional[int] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., value_formats: _Optional[int] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DropRequest(_message.Message):
    __slots__ = ("session_id", "why")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    why: str
    def __init__(self, session_id: _Optional[int] = ..., why: _Optional[str] = ...) -> None: ...

class DropResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
