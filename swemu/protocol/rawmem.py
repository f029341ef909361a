"""Arrays over raw addresses, for the compiled hot loops.

A slice-and-``view`` of a packet's payload (``row[10:].view(np.uint32)``) is a
new array that owns a reference: Numba updates its count with atomic
instructions when the view is made and dropped (four for the ``view`` alone).
Made per packet, that was about a tenth of a worker's CPU. :func:`words_at`
makes the same view over the same bytes with no owner and no reference
counting; the caller keeps the underlying buffer alive, as it does anyway for
the duration of the compiled call.

The arrays are built by two intrinsics (the array structure filled in
directly) rather than with ``numba.carray``: ``carray`` is an overload that
Numba compiles as a separate library for every array type it is used with
(about a second of first-run compile time in the emulator, half that in a
worker, for the same machine code once inlined).

:func:`bswap32` (network <-> host order of a payload word) lives here too: the
emulator's kernels and the host library's both inline it; :func:`bswap16` is the
same for the 16-bit values of docs/protocol.md §4.2.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.core.imputils import impl_ret_borrowed, lower_builtin
from numba.extending import intrinsic, type_callable
from numba.np.arrayobj import make_array, populate_array

from .jit import kernel


@intrinsic
def _vector_at(typingctx, addr, n, dtype):
    """``n`` items of ``dtype`` (a NumPy scalar class) at byte address ``addr``:
    a 1-d C-contiguous array with no owner (what ``carray`` returns)."""
    if not isinstance(addr, types.Integer) or not isinstance(n, types.Integer):
        return None
    if not isinstance(dtype, types.NumberClass):
        return None
    ret = types.Array(dtype.instance_type, 1, "C")

    def codegen(context, builder, signature, args):
        addr_v, n_v, _ = args
        intp = context.get_value_type(types.intp)
        size = context.get_abi_sizeof(context.get_data_type(ret.dtype))
        itemsize = context.get_constant(types.intp, size)
        out = make_array(ret)(context, builder)
        data = builder.inttoptr(
            context.cast(builder, addr_v, signature.args[0], types.intp), out.data.type
        )
        count = context.cast(builder, n_v, signature.args[1], types.intp)
        populate_array(
            out,
            data=data,
            shape=cgutils.pack_array(builder, [count], ty=intp),
            strides=cgutils.pack_array(builder, [itemsize], ty=intp),
            itemsize=itemsize,
            meminfo=None,
        )
        return out._getvalue()

    return ret(addr, n, dtype), codegen


@kernel(inline=True)
def words_at(addr, n):
    """``n`` uint32 words (native order, any alignment x86/arm64 accept) at byte
    address ``addr``, as an array that does not own or count its memory."""
    return _vector_at(addr, n, np.uint32)


@kernel(inline=True)
def halves_at(addr, n):
    """``n`` uint16 (native order) at byte address ``addr``, as an array that does
    not own or count its memory: the payload of a 16-bit packet (docs/protocol.md §4.2)."""
    return _vector_at(addr, n, np.uint16)


@kernel(inline=True)
def bytes_at(addr, n):
    """``n`` bytes at address ``addr``, as an array that does not own or count
    its memory (a datagram where the kernel left it, say)."""
    return _vector_at(addr, n, np.uint8)


@kernel(inline=True)
def int8s_at(addr, n):
    """``n`` int8 at address ``addr``, as an array that does not own or count its memory."""
    return _vector_at(addr, n, np.int8)


@kernel(inline=True)
def int32s_at(addr, n):
    """``n`` int32 at address ``addr``, as an array that does not own or count its memory."""
    return _vector_at(addr, n, np.int32)


@kernel(inline=True)
def int64s_at(addr, n):
    """``n`` int64 at address ``addr``, as an array that does not own or count its memory."""
    return _vector_at(addr, n, np.int64)


@kernel(inline=True)
def float64s_at(addr, n):
    """``n`` float64 at address ``addr``, as an array that does not own or count its memory."""
    return _vector_at(addr, n, np.float64)


def unowned(a):
    """The same array as ``a`` (shape, dtype, memory), without its owner: passed
    to or inlined into per-packet helpers, it costs no reference counting
    (atomic instructions, each waiting for earlier stores to drain). The
    caller keeps ``a`` alive. In compiled code the array structure is copied
    without its meminfo (typed and lowered directly: nothing to compile per
    array type). A tuple (a state record such as
    :class:`swemu.core.state.SwitchState`, nested records included) comes back
    as the same kind of tuple with every array in it owner-less; anything else
    passes through unchanged, and an array that is not C-contiguous is a typing
    error. Called from Python it returns ``a``."""
    return a


def _unowned_type(a: types.Type) -> types.Type:
    if isinstance(a, types.Array):
        if a.layout != "C":
            raise TypingError(f"unowned needs a C-contiguous array, not {a}")
        return types.Array(a.dtype, a.ndim, "C")
    if isinstance(a, types.BaseTuple):
        pyclass = getattr(a, "instance_class", None)
        return types.BaseTuple.from_types([_unowned_type(t) for t in a], pyclass)
    return a


@type_callable(unowned)
def _type_unowned(context):
    def typer(a):
        return _unowned_type(a)

    return typer


def _unowned_value(context, builder, aty, rty, value):
    if isinstance(aty, types.Array):
        src = make_array(aty)(context, builder, value=value)
        out = make_array(rty)(context, builder)
        populate_array(
            out,
            data=src.data,
            shape=src.shape,
            strides=src.strides,
            itemsize=src.itemsize,
            meminfo=None,
        )
        return out._getvalue()
    if isinstance(aty, types.BaseTuple):
        items = [
            _unowned_value(context, builder, t, r, builder.extract_value(value, i))
            for i, (t, r) in enumerate(zip(aty, rty))
        ]
        return context.make_tuple(builder, rty, items)
    return value


@lower_builtin(unowned, types.Any)
def _lower_unowned(context, builder, sig, args):
    (aty,), (value,) = sig.args, args
    out = _unowned_value(context, builder, aty, sig.return_type, value)
    return impl_ret_borrowed(context, builder, sig.return_type, out)


@kernel(inline=True)
def bswap32(u):
    """Network <-> host order of a uint32. The payload is handled as uint32
    words (an unaligned view: the header is 10 bytes), so these loops vectorize."""
    u = np.uint32(u)
    return np.uint32(
        (
            (u >> np.uint32(24))
            | ((u >> np.uint32(8)) & np.uint32(0xFF00))
            | ((u << np.uint32(8)) & np.uint32(0xFF0000))
            | (u << np.uint32(24))
        )
        & np.uint32(0xFFFFFFFF)  # Numba computes in 64 bits
    )


@kernel(inline=True)
def bswap16(u):
    """Network <-> host order of a uint16 (a 16-bit value of docs/protocol.md §4.2)."""
    u = np.uint16(u)
    return np.uint16(((u >> np.uint16(8)) | (u << np.uint16(8))) & np.uint16(0xFFFF))
