from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("rank", "registered", "ip", "udp_port", "counters", "child")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RANK_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    UDP_PORT_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    CHILD_FIELD_NUMBER: _ClassVar[int]
    rank: int
    registered: bool
    ip: str
    udp_port: int
    counters: _containers.ScalarMap[str, int]
    child: str
    def __init__(self, rank: _Optional[int] = ..., registered: _Optional[bool] = ..., ip: _Optional[str] = ..., udp_port: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., child: _Optional[str] = ...) -> None: ...

class JobStats(_message.Message):
    __slots__ = ("session_id", "index", "num_workers", "size_code", "pool_size", "memory_bytes", "slots_pending", "slots_holding", "last_seen", "counters", "workers", "faults", "parent", "uplink")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class FaultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SIZE_CODE_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    SLOTS_HOLDING_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    UPLINK_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    index: int
    num_workers: int
    size_code: int
    pool_size: int
    memory_bytes: int
    slots_pending: _containers.RepeatedScalarFieldContainer[int]
    slots_holding: _containers.RepeatedScalarFieldContainer[int]
    last_seen: float
    counters: _containers.ScalarMap[str, int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStats]
    faults: _containers.ScalarMap[str, int]
    parent: str
    uplink: str
    def __init__(self, session_id: _Optional[int] = ..., index: _Optional[int] = ..., num_workers: _Optional[int] = ..., size_code: _Optional[int] = ..., pool_size: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., slots_pending: _Optional[_Iterable[int]] = ..., slots_holding: _Optional[_Iterable[int]] = ..., last_seen: _Optional[float] = ..., counters: _Optional[_Mapping[str, int]] = ..., workers: _Optional[_Iterable[_Union[WorkerStats, _Mapping]]] = ..., faults: _Optional[_Mapping[str, int]] = ..., parent: _Optional[str] = ..., uplink: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("pool_size", "max_workers", "max_jobs", "max_pool_memory", "idle_timeout", "evict_after")
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    MAX_POOL_MEMORY_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    EVICT_AFTER_FIELD_NUMBER: _ClassVar[int]
    pool_size: int
    max_workers: int
    max_jobs: int
    max_pool_memory: int
    idle_timeout: float
    evict_after: float
    def __init__(self, pool_size: _Optional[int] = ..., max_workers: _Optional[int] = ..., max_jobs: _Optional[int] = ..., max_pool_memory: _Optional[int] = ..., idle_timeout: _Optional[float] = ..., evict_after: _Optional[float] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("timestamp", "uptime", "counters", "released", "memory_in_use", "max_pool_memory", "jobs", "data_plane", "data_address", "control_address", "limits", "faults", "fault_configs", "capture", "version", "fabric")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ReleasedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DataPlaneEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class FaultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class CaptureEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    UPTIME_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IN_USE_FIELD_NUMBER: _ClassVar[int]
    MAX_POOL_MEMORY_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    FAULT_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FABRIC_FIELD_NUMBER: _ClassVar[int]
    timestamp: float
    uptime: float
    counters: _containers.ScalarMap[str, int]
    released: _containers.ScalarMap[str, int]
    memory_in_use: int
    max_pool_memory: int
    jobs: _containers.RepeatedCompositeFieldContainer[JobStats]
    data_plane: _containers.ScalarMap[str, int]
    data_address: str
    control_address: str
    limits: Limits
    faults: _containers.ScalarMap[str, int]
    fault_configs: _containers.RepeatedCompositeFieldContainer[FaultConfig]
    capture: _containers.ScalarMap[str, int]
    version: str
    fabric: FabricStats
    def __init__(self, timestamp: _Optional[float] = ..., uptime: _Optional[float] = ..., counters: _Optional[_Mapping[str, int]] = ..., released: _Optional[_Mapping[str, int]] = ..., memory_in_use: _Optional[int] = ..., max_pool_memory: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[JobStats, _Mapping]]] = ..., data_plane: _Optional[_Mapping[str, int]] = ..., data_address: _Optional[str] = ..., control_address: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., faults: _Optional[_Mapping[str, int]] = ..., fault_configs: _Optional[_Iterable[_Union[FaultConfig, _Mapping]]] = ..., capture: _Optional[_Mapping[str, int]] = ..., version: _Optional[str] = ..., fabric: _Optional[_Union[FabricStats, _Mapping]] = ...) -> None: ...

class FabricStats(_message.Message):
    __slots__ = ("instance", "parent", "parent_instance", "always_up", "children", "jobs_up")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    PARENT_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ALWAYS_UP_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    JOBS_UP_FIELD_NUMBER: _ClassVar[int]
    instance: int
    parent: str
    parent_instance: int
    always_up: bool
    children: _containers.RepeatedScalarFieldContainer[str]
    jobs_up: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, instance: _Optional[int] = ..., parent: _Optional[str] = ..., parent_instance: _Optional[int] = ..., always_up: _Optional[bool] = ..., children: _Optional[_Iterable[str]] = ..., jobs_up: _Optional[_Iterable[int]] = ...) -> None: ...

class FaultConfig(_message.Message):
    __slots__ = ("session_id", "loss_in", "loss_out", "duplicate", "reorder_ms", "delay_ms", "seed", "worker", "link_gbps")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LOSS_IN_FIELD_NUMBER: _ClassVar[int]
    LOSS_OUT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    REORDER_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    LINK_GBPS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    loss_in: float
    loss_out: float
    duplicate: float
    reorder_ms: float
    delay_ms: float
    seed: int
    worker: int
    link_gbps: float
    def __init__(self, session_id: _Optional[int] = ..., loss_in: _Optional[float] = ..., loss_out: _Optional[float] = ..., duplicate: _Optional[float] = ..., reorder_ms: _Optional[float] = ..., delay_ms: _Optional[float] = ..., seed: _Optional[int] = ..., worker: _Optional[int] = ..., link_gbps: _Optional[float] = ...) -> None: ...
