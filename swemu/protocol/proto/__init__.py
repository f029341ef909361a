"""Generated gRPC stubs for the SwitchML control plane (``switchml.proto``), the
emulator's own service (``emulator.proto``) and its fabric (``fabric.proto``).

The generated modules are committed so that ``pip install`` needs no protoc.
Regenerate after editing the .proto with ``python -m swemu.protocol.proto.regenerate``
(needs the ``dev`` extra, which brings grpcio-tools).

May import: nothing but its own stubs.
"""

from . import switchml_pb2, switchml_pb2_grpc

__all__ = ["CONTROL_MESSAGE_BYTES", "switchml_pb2", "switchml_pb2_grpc"]
# fabric_pb2 (and emulator_pb2) are imported by their users: a hardware
# controller never needs them

#: The largest control-plane message either side takes (servers and channels set
#: it): a Resume's report holds each slot's last result, up to 512 slots of
#: 16 KiB, beyond gRPC's default of 4 MiB.
CONTROL_MESSAGE_BYTES = 64 << 20
