"""Result arrays that do not fault: the memory behind ``ctx.allreduce(x)``.

``allreduce(x)`` without ``out=`` hands back a new array each call. Allocated the
plain way (``np.empty_like``), a large result is a fresh ``mmap`` of the
process every call (glibc maps every block above its mmap threshold, at most
32 MiB, and unmaps it on free), so the allreduce itself then takes the page
faults of its result while it drains the socket, and the kernel zeroes (and,
for transparent huge pages, may compact) that memory first. At 64 MiB the
faults cost a few milliseconds of CPU, but taken inside the receive loop they
let a window of results overflow the socket buffer, which then waits for its
retransmission timeout: a first call took 4-5x a warm one.

:class:`ResultPool` keeps the blocks of results the caller has dropped and hands
them out again. A result is an ordinary NumPy array; its ``base`` chain ends in
a small holder object whose finalizer gives the block back once nothing refers
to the array or any view of it (``torch.from_numpy``, slices and reshapes keep
the holder alive like any base). A training loop that rebinds its result
(``g = ctx.allreduce(g)``) thus runs on two blocks, touched once.

May import: numpy (nothing of the project).
"""

from __future__ import annotations

import collections
import threading

import numpy as np

#: results smaller than this come from ``np.empty`` (NumPy's own small-block
#: cache and glibc's heap already reuse them without faults)
MIN_POOLED = 1 << 20
#: free blocks kept per size: a result the caller still holds while asking for
#: the next one, plus the next one
KEEP_PER_SIZE = 2


class _Block:
    """The owner of a pooled block: an array's ``base``, exposing the block's
    memory through the array interface, returning it to its pool on finalize."""

    __slots__ = ("__array_interface__", "block", "pool")

    def __init__(self, block: np.ndarray, pool: ResultPool) -> None:
        self.block = block
        self.pool = pool
        self.__array_interface__ = block.__array_interface__

    def __del__(self) -> None:
        self.pool._give_back(self.block)


class ResultPool:
    """Reusable memory for result arrays (see the module docstring).

    Thread-safe: a result may be dropped on any thread. At most
    ``keep_per_size`` free blocks of each size are kept (the rest are freed), and
    :meth:`clear` frees them all (a context calls it when it closes; results
    still held by the caller stay valid and are then freed normally)."""

    def __init__(self, keep_per_size: int = KEEP_PER_SIZE, min_pooled: int = MIN_POOLED) -> None:
        self.keep_per_size = keep_per_size
        self.min_pooled = min_pooled
        self._free: dict[int, collections.deque[np.ndarray]] = {}
        self._lock = threading.Lock()
        self._open = True
        self.allocated = 0  # blocks made (each faults once)
        self.reused = 0  # results served from a kept block

    def empty_like(self, x: np.ndarray) -> np.ndarray:
        """An uninitialised C-contiguous array of ``x``'s shape and dtype."""
        if not isinstance(x, np.ndarray):  # the caller's validation says what is wrong
            return np.empty_like(x)
        nbytes = x.nbytes
        if nbytes < self.min_pooled or not self._open:
            return np.empty(x.shape, x.dtype)
        with self._lock:
            free = self._free.get(nbytes)
            block = free.pop() if free else None
            if block is None:
                self.allocated += 1
            else:
                self.reused += 1
        if block is None:
            # Touched here, once, rather than page by page while the results
            # arrive: a fault in the receive loop holds up the socket's draining
            # (a window of datagrams overflows, and waits for its timeout).
            block = np.empty(nbytes, np.uint8)
            block.fill(0)
        flat = np.asarray(_Block(block, self))
        return flat.view(x.dtype).reshape(x.shape)

    def _give_back(self, block: np.ndarray) -> None:
        with self._lock:
            if not self._open:
                return
            free = self._free.setdefault(block.nbytes, collections.deque())
            if len(free) < self.keep_per_size:
                free.append(block)

    @property
    def free_bytes(self) -> int:
        """Bytes held in free blocks, ready for the next result."""
        with self._lock:
            return sum(b.nbytes for q in self._free.values() for b in q)

    def clear(self) -> None:
        """Free every kept block; later results come from ``np.empty``."""
        with self._lock:
            self._open = False
            self._free.clear()
