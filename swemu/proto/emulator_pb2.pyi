from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("counters", "ip", "rank", "registered", "udp_port")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

    RANK_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    UDP_PORT_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    registered: bool
    ip: str
    udp_port: int
    counters: _containers.ScalarMap[str, int]
    def __init__(
        self,
        rank: int | None = ...,
        registered: bool | None = ...,
        ip: str | None = ...,
        udp_port: int | None = ...,
        counters: _Mapping[str, int] | None = ...,
    ) -> None: ...

class JobStats(_message.Message):
    __slots__ = (
        "counters",
        "faults",
        "index",
        "last_seen",
        "memory_bytes",
        "num_workers",
        "pool_size",
        "session_id",
        "size_code",
        "slots_holding",
        "slots_pending",
        "workers",
    )
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

    class FaultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

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
    def __init__(
        self,
        session_id: int | None = ...,
        index: int | None = ...,
        num_workers: int | None = ...,
        size_code: int | None = ...,
        pool_size: int | None = ...,
        memory_bytes: int | None = ...,
        slots_pending: _Iterable[int] | None = ...,
        slots_holding: _Iterable[int] | None = ...,
        last_seen: float | None = ...,
        counters: _Mapping[str, int] | None = ...,
        workers: _Iterable[WorkerStats | _Mapping] | None = ...,
        faults: _Mapping[str, int] | None = ...,
    ) -> None: ...

class Limits(_message.Message):
    __slots__ = ("idle_timeout", "max_jobs", "max_pool_memory", "max_workers", "pool_size")
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    MAX_POOL_MEMORY_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    pool_size: int
    max_workers: int
    max_jobs: int
    max_pool_memory: int
    idle_timeout: float
    def __init__(
        self,
        pool_size: int | None = ...,
        max_workers: int | None = ...,
        max_jobs: int | None = ...,
        max_pool_memory: int | None = ...,
        idle_timeout: float | None = ...,
    ) -> None: ...

class Stats(_message.Message):
    __slots__ = (
        "capture",
        "control_address",
        "counters",
        "data_address",
        "data_plane",
        "fault_configs",
        "faults",
        "jobs",
        "limits",
        "max_pool_memory",
        "memory_in_use",
        "released",
        "timestamp",
        "uptime",
        "version",
    )
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

    class ReleasedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

    class DataPlaneEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

    class FaultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

    class CaptureEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

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
    def __init__(
        self,
        timestamp: float | None = ...,
        uptime: float | None = ...,
        counters: _Mapping[str, int] | None = ...,
        released: _Mapping[str, int] | None = ...,
        memory_in_use: int | None = ...,
        max_pool_memory: int | None = ...,
        jobs: _Iterable[JobStats | _Mapping] | None = ...,
        data_plane: _Mapping[str, int] | None = ...,
        data_address: str | None = ...,
        control_address: str | None = ...,
        limits: Limits | _Mapping | None = ...,
        faults: _Mapping[str, int] | None = ...,
        fault_configs: _Iterable[FaultConfig | _Mapping] | None = ...,
        capture: _Mapping[str, int] | None = ...,
        version: str | None = ...,
    ) -> None: ...

class FaultConfig(_message.Message):
    __slots__ = (
        "delay_ms",
        "duplicate",
        "link_gbps",
        "loss_in",
        "loss_out",
        "reorder_ms",
        "seed",
        "session_id",
        "worker",
    )
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
    def __init__(
        self,
        session_id: int | None = ...,
        loss_in: float | None = ...,
        loss_out: float | None = ...,
        duplicate: float | None = ...,
        reorder_ms: float | None = ...,
        delay_ms: float | None = ...,
        seed: int | None = ...,
        worker: int | None = ...,
        link_gbps: float | None = ...,
    ) -> None: ...
