"""The SwitchML protocol both sides share.

The packet codec (``wire``), the gRPC stubs (``proto``), batched UDP I/O from
compiled code (``fastio``), arrays over raw addresses and word byte order
(``rawmem``), socket helpers (``netutil``), the version (``version``), and how
every kernel of both sides is compiled (``jit``). The host library and the
emulator import these modules by their public names. Nothing is imported
eagerly here: ``fastio``, ``rawmem`` and ``jit`` pull in Numba, and importing
the codec stays cheap.

May import: the standard library, numpy, numba, grpc/protobuf — nothing of the
project.
"""
