"""The worker's side of SwitchML, sans-IO: what a worker and a switch's uplink share.

The protocol engine of one worker in one job (:mod:`.protocol`: window, shadow
sets, timers, the exponent window of docs/protocol.md §3–§4), its Numba kernels
(:mod:`.kernels`, with the retransmission timer a child switch uses toward its
parent; :mod:`.block16` for 16-bit values and tensors), block floating point in
plain numpy (:mod:`.quant`, the test oracle),
streaming stores (:mod:`.stream`), deterministic inputs with known sums
(:mod:`.testdata`) and the errors it raises (:mod:`.errors`).

It lives here, below both sides, because three users drive it: the host library
over sockets (``hostlib``), a child switch toward its parent (``swemu.serving``)
and the scale model's packet-level reference (``swemu.model``). Nothing opens a
socket or reads the clock.

May import: the standard library, numpy, numba, llvmlite and the rest of
swemu.protocol — nothing else of the project.
"""
