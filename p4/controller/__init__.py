"""The hardware controller of p4/switchml.p4: the control-plane model of
:mod:`swemu.core.controller` written through BF Runtime.

* :class:`TofinoTarget` (``bfrt_target``): the model's tables on a Tofino;
* :class:`RecordingBfrt` (``recording_bfrt``): the BF Runtime client in memory,
  checked against the P4 source (tests, the dry run);
* ``p4_schema``: the BF Runtime names of the P4 source, and their comparison with
  the ``bfrt.json`` bf-p4c writes (``python -m p4.controller.p4_schema BFRT_JSON``);
* ``switchml_ctl.py``: the controller process, serving docs/protocol.md §5's gRPC API.

May import: swemu.protocol, swemu.core (the model; the engine only in the dry
run), swemu.serving (the dry run's data plane and gRPC services).
"""

from __future__ import annotations

from .bfrt_target import TofinoJob, TofinoTarget, WorkerPort
from .p4_schema import TableSchema, load_schema
from .recording_bfrt import BfrtError, RecordingBfrt, Write, format_write

__all__ = [
    "BfrtError",
    "RecordingBfrt",
    "TableSchema",
    "TofinoJob",
    "TofinoTarget",
    "WorkerPort",
    "Write",
    "format_write",
    "load_schema",
]
