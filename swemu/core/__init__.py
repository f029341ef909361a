"""The switch itself, sans-IO.

The engine (tables, counters, registration) and the emulator's target of the
control model, the records and column names its kernels take (``state``), its
Numba kernels and their plain-Python twin (``reference``), the control-plane
model (the session rules any target follows), the fault model and its kernels.
No sockets, no event loop.

May import: swemu.protocol.
"""
