"""swemu.protocol.rawmem: owner-less array views for the compiled hot loops."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from swemu.protocol.rawmem import bytes_at, unowned, words_at


@njit
def _bump_through_view(a, k):
    v = unowned(a)
    v[:] += k
    return v.shape, unowned(k)


def test_unowned_is_the_same_memory_and_passes_scalars_through():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    shape, k = _bump_through_view(a, 5)
    assert shape == (3, 4) and k == 5
    np.testing.assert_array_equal(a, np.arange(12).reshape(3, 4) + 5)


def test_unowned_refuses_a_strided_array():
    a = np.zeros(8, np.int64)
    with pytest.raises(TypingError, match="C-contiguous"):
        _bump_through_view(a[::2], 1)


@njit
def _views(addr):
    w = words_at(addr, 2)
    b = bytes_at(addr, 8)
    return w[0] + w[1], b[4]


def test_views_by_address_read_unaligned_memory():
    raw = np.zeros(16, np.uint8)
    raw[1:9] = np.array([1, 0, 0, 0, 2, 0, 0, 0], np.uint8)  # two little-endian words, off by one
    total, fifth = _views(raw.ctypes.data + 1)
    assert total == 3 and fifth == 2
    assert unowned(raw) is raw  # from Python: the array itself
