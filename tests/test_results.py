"""hostlib.results: result memory reused once the caller drops a result, never
while any view of it lives; and the same sums through a real emulator."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import workers
from workers import rank_input

from hostlib.pytest_plugin import run_workers
from hostlib.quant import error_bound
from hostlib.results import MIN_POOLED, ResultPool
from swemu.launch import EmulatorProcess

N = MIN_POOLED // 4  # float32 / int32 elements of the smallest pooled result


def test_small_results_are_plain_arrays():
    pool = ResultPool()
    y = pool.empty_like(np.zeros(10, np.float32))
    assert y.shape == (10,) and y.dtype == np.float32 and y.base is None
    assert pool.allocated == pool.reused == 0


def test_a_dropped_result_is_reused_and_a_held_one_is_not():
    pool = ResultPool()
    x = np.zeros((4, N // 4), np.float32)
    a = pool.empty_like(x)
    assert a.shape == x.shape and a.dtype == x.dtype and a.flags.c_contiguous
    a[:] = 1
    b = pool.empty_like(x)  # a is held: a new block
    assert not np.shares_memory(a, b)
    assert (pool.allocated, pool.reused) == (2, 0)
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    c = pool.empty_like(x)
    assert c.__array_interface__["data"][0] == address
    assert (pool.allocated, pool.reused) == (2, 1)
    assert not np.shares_memory(b, c)


@pytest.mark.parametrize(
    "keep",
    [
        lambda y: y[10:20],
        lambda y: y.reshape(-1),
        lambda y: y.view(np.int32),
        lambda y: memoryview(y),
    ],
)
def test_any_view_keeps_the_block(keep):
    pool = ResultPool()
    x = np.zeros(N, np.float32)
    y = pool.empty_like(x)
    y[:] = 7
    view = keep(y)
    del y
    gc.collect()
    z = pool.empty_like(x)  # must not get the viewed block
    z[:] = -1
    assert pool.reused == 0
    assert np.all(np.asarray(view).view(np.float32) == 7)


def test_a_torch_tensor_keeps_the_block():
    torch = pytest.importorskip("torch")
    pool = ResultPool()
    y = pool.empty_like(np.zeros(N, np.float32))
    y[:] = 3
    t = torch.from_numpy(y)
    del y
    gc.collect()
    pool.empty_like(np.zeros(N, np.float32))[:] = 0
    assert pool.reused == 0 and float(t.sum()) == 3 * N


def test_at_most_keep_per_size_blocks_are_kept_and_clear_frees_them():
    pool = ResultPool(keep_per_size=2)
    x = np.zeros(N, np.int32)
    held = [pool.empty_like(x) for _ in range(5)]
    del held
    gc.collect()
    assert pool.free_bytes == 2 * x.nbytes
    pool.clear()
    assert pool.free_bytes == 0
    y = pool.empty_like(x)  # after clear: plain arrays
    assert y.base is None


def test_results_dropped_on_other_threads():
    pool = ResultPool(keep_per_size=4)
    x = np.zeros(N, np.float32)
    arrays = [pool.empty_like(x) for _ in range(8)]
    threads = [threading.Thread(target=arrays.pop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert pool.free_bytes == 4 * x.nbytes


@pytest.fixture(scope="module")
def emulator():
    with EmulatorProcess("--pool-size", "1024") as emu:
        yield emu


def test_allreduce_without_out_reuses_result_memory_and_sums_right(emulator):
    w, n, calls = 3, N + 1001, 6
    results = run_workers(emulator.switch, emulator.control, w, workers.pooled_results, n, calls)
    for call in range(calls):
        dtype = np.int32 if call % 2 == 0 else np.float32
        inputs = [rank_input(r, n, call, dtype) for r in range(w)]
        if dtype == np.int32:
            want = np.sum([x.astype(np.int64) for x in inputs], axis=0).astype(np.int32)
            for r in range(w):
                np.testing.assert_array_equal(results[r]["rebound"][call], want)
        else:
            exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
            m = np.max(np.abs(inputs), axis=0)
            nv = 32 << 6
            bound = np.repeat(error_bound(np.maximum.reduceat(m, np.arange(0, n, nv)), w), nv)
            for r in range(w):
                assert np.all(np.abs(results[r]["rebound"][call] - exact) <= bound[:n])
    for call, y in zip((100, 101), results[0]["held"]):
        want = np.sum([rank_input(r, n, call).astype(np.int64) for r in range(w)], axis=0)
        np.testing.assert_array_equal(y, want.astype(np.int32))
    for res in results:
        assert res["distinct"]
        # a rebound result is dropped after the next call returns: two blocks
        # per size at most serve the loop; the held pair needs no third
        assert res["allocated"] <= 4 and res["reused"] >= calls - 2
