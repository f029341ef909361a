"""Arrays over raw addresses, for the compiled hot loops.

A slice-and-``view`` of a packet's payload (``row[10:].view(np.uint32)``) is a
new array that owns a reference: Numba updates its count with atomic
instructions when the view is made and dropped (four for the ``view`` alone).
Made per packet, that was about a tenth of a worker's CPU. :func:`words_at`
makes the same view over the same bytes with no owner and no reference
counting; the caller keeps the underlying buffer alive, as it does anyway for
the duration of the compiled call.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload


@intrinsic
def _voidptr(typingctx, addr):
    """The integer ``addr`` as a ``void *``."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(addr), codegen


@njit(cache=True, nogil=True, inline="always")
def words_at(addr, n):
    """``n`` uint32 words (native order, any alignment x86/arm64 accept) at byte
    address ``addr``, as an array that does not own or count its memory."""
    return carray(_voidptr(addr), n, np.uint32)


@njit(cache=True, nogil=True, inline="always")
def bytes_at(addr, n):
    """``n`` bytes at address ``addr``, as an array that does not own or count
    its memory (a datagram where the kernel left it, say)."""
    return carray(_voidptr(addr), n, np.uint8)


def unowned(a):
    """The same array as ``a`` (shape, dtype, memory), without its owner: passed
    to or inlined into per-packet helpers, it costs no reference counting
    (atomic instructions, each waiting for earlier stores to drain). The
    caller keeps ``a`` alive. In compiled code only (an overload); anything
    that is not an array passes through unchanged, and an array that is not
    C-contiguous is a typing error. Called from Python it returns ``a``."""
    return a


@overload(unowned, inline="always")
def _unowned(a):
    if not isinstance(a, types.Array):
        return lambda a: a
    if a.layout != "C":
        raise TypingError(f"unowned needs a C-contiguous array, not {a}")

    def impl(a):
        return carray(_voidptr(a.ctypes.data), a.shape, a.dtype)

    return impl
