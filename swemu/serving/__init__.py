"""The switch on the machine.

The asyncio data plane and its compiled loops, the gRPC control services,
fault control of a running emulator, the server, the sharded emulator.

May import: swemu.protocol, swemu.core, swemu.observe.
"""
