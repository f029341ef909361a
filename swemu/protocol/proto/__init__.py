"""Generated gRPC stubs for the SwitchML control plane (``switchml.proto``).

The generated modules are committed so that ``pip install`` needs no protoc.
Regenerate after editing the .proto with ``python -m swemu.protocol.proto.regenerate``
(needs the ``dev`` extra, which brings grpcio-tools).

May import: nothing but its own stubs.
"""

from . import switchml_pb2, switchml_pb2_grpc

__all__ = ["switchml_pb2", "switchml_pb2_grpc"]
