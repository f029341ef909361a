"""End to end: a real emulator process and real worker processes on the loopback."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import workers
from workers import LENGTHS, rank_input

import hostlib
from hostlib.pytest_plugin import WorkerFailed, Workers, run_workers
from hostlib.quant import error_bound
from swemu.launch import ChildFailed, EmulatorProcess, Watched


@pytest.fixture(scope="module")
def emulator():
    with EmulatorProcess("--pool-size", "1024") as emu:
        yield emu


def expected(w: int, n: int, call: int, dtype=np.int32) -> np.ndarray:
    return np.sum(
        [
            rank_input(r, n, call, dtype).astype(np.int64 if dtype == np.int32 else np.float64)
            for r in range(w)
        ],
        axis=0,
    )


@pytest.mark.parametrize("w", [1, 2, 4])
def test_int32_exact_for_all_lengths_and_consecutive_calls(emulator, w):
    results = run_workers(emulator.switch, emulator.control, w, workers.int_lengths)
    for call, n in enumerate(LENGTHS):
        want = expected(w, n, call)
        for r in range(w):
            np.testing.assert_array_equal(results[r][call], want, err_msg=f"rank {r} n={n}")
    np.testing.assert_array_equal(results[0][-1], expected(w, 777, 99))
    for r in range(1, w):  # identical on every rank
        for a, b in zip(results[0], results[r]):
            assert a.tobytes() == b.tobytes()


def test_float32_within_bound_and_identical_on_every_rank(emulator):
    w, n, nv = 4, 300_000, 256
    results = run_workers(
        emulator.switch, emulator.control, w, workers.float_random, n, packet_size=3
    )
    inputs = [rank_input(r, n, 0, np.float32) for r in range(w)]
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    m = np.max([np.abs(x) for x in inputs], axis=0)
    bound = np.repeat(error_bound(np.maximum.reduceat(m, np.arange(0, n, nv)), w), nv)[:n]
    for y in results:
        assert y.dtype == np.float32
        assert np.all(np.abs(y - exact) <= bound)
        assert y.tobytes() == results[0].tobytes()
    np.testing.assert_array_equal(results[0][:600], 0)


def test_packet_sizes_and_windows(emulator):
    cases = [(0, 1), (1, 7), (3, 64), (6, 16), (7, 3)]
    results = run_workers(emulator.switch, emulator.control, 3, workers.configs, cases)
    i = 0
    for code, _ in cases:
        for call in range(2):
            want = expected(3, 5000 + 37 * code, call)
            for r in range(3):
                np.testing.assert_array_equal(results[r][i], want, err_msg=f"code {code}")
            i += 1


def test_dead_peer_makes_the_others_fail_in_time_and_emulator_recovers(emulator):
    switch, control = emulator.switch, emulator.control
    with Workers(switch, control, 3, workers.die_or_wait, 1, no_progress=2.0) as ranks:
        got = ranks.results(60, ranks=(0, 2))  # the two survivors report; rank 1 dies
        codes = ranks.exitcodes(10)
    assert codes[1] == 17 and set(got) == {0, 2}
    for r in (0, 2):
        took, msg = got[r].split("|", 1)
        assert 2.0 <= float(took) < 6.0, got[r]
        assert "no result for chunk" in msg and "slot" in msg and emulator.switch in msg
    # a new job on the same emulator works
    out = run_workers(emulator.switch, emulator.control, 2, workers.float_random, 1000)
    assert out[0].tobytes() == out[1].tobytes()


def test_victim_exit_is_reported_when_a_rank_dies():
    # run_workers itself reports a rank that died without a result, as soon as
    # it is gone, with the rank's exit status and stderr: not when the other
    # rank gives up on it (no_progress), nor after run_workers' timeout
    match = "rank 0 exited without a result: rank 0: exit status 17, its stderr:\nrank 0 dies"
    with EmulatorProcess() as emu, pytest.raises(WorkerFailed, match=match):
        t0 = time.monotonic()
        run_workers(
            emu.switch, emu.control, 2, workers.die_or_wait, 0, no_progress=600.0, timeout=900
        )
    assert time.monotonic() - t0 < 300  # the ranks' start-up, even on a loaded machine


def test_unreachable_controller_names_the_address():
    t0 = time.monotonic()
    with pytest.raises(hostlib.ControlPlaneError, match=r"127\.0\.0\.1:9"):
        hostlib.connect(switch="127.0.0.1:9", control="127.0.0.1:9", connect_timeout=1.0).open()
    assert time.monotonic() - t0 < 5


def test_the_control_address_alone_finds_the_data_port(emulator):
    """No switch address: the controller's reply names its data port (a random
    one here), and the explicit address, when given, is used as it is."""
    assert not emulator.switch.endswith(":48864")
    x = np.arange(5000, dtype=np.int32)
    with hostlib.connect(None, emulator.control, rank=0, world_size=1) as ctx:
        np.testing.assert_array_equal(ctx.allreduce(x), x)
        assert ctx.switch_address == emulator.switch
    with hostlib.connect(emulator.switch, emulator.control, rank=0, world_size=1) as ctx:
        np.testing.assert_array_equal(ctx.allreduce(x), x)


def test_unreachable_switch_names_the_address(emulator):
    with hostlib.connect(switch="127.0.0.1:9", control=emulator.control, no_progress=1.0) as c:
        t0 = time.monotonic()
        with pytest.raises(hostlib.NoProgressError, match=r"127\.0\.0\.1:9"):
            c.allreduce(np.ones(100, np.int32))
        assert time.monotonic() - t0 < 4


def test_bad_dtype_and_shape(emulator):
    with hostlib.connect(emulator.switch, emulator.control) as c:
        with pytest.raises(TypeError, match="int32, float32, float16 and bfloat16"):
            c.allreduce(np.ones(3, np.float64))
        with pytest.raises(TypeError, match="numpy array"):
            c.allreduce([1, 2, 3])
        with pytest.raises(ValueError, match="C-contiguous"):
            c.allreduce(np.ones((4, 4), np.int32).T)
        assert c.allreduce(np.arange(5, dtype=np.int32)).tolist() == [0, 1, 2, 3, 4]


async def test_async_api_two_workers_in_one_loop(emulator):
    import asyncio

    async def one(rank):
        async with hostlib.aconnect(
            emulator.switch, emulator.control, rank=rank, world_size=2, window=8
        ) as a:
            return [await a.allreduce(np.full(1000, rank + 1, np.int32)) for _ in range(3)]

    r0, r1 = await asyncio.gather(one(0), one(1))
    for y in r0 + r1:
        assert (y == 3).all()


def test_plugin_fixture_runs_user_code(switchml_workers):
    out = switchml_workers(2, workers.float_random, 100)
    assert out[0].tobytes() == out[1].tobytes()


def test_mac_of_a_local_address():
    """The MAC sent in UdpSession is the interface's (0 for loopback: it has none)."""
    import os
    from pathlib import Path

    from swemu.protocol.netutil import mac_of_ipv4

    assert mac_of_ipv4("127.0.0.1") == 0
    assert mac_of_ipv4("203.0.113.250") == 0  # nobody's address
    for name in os.listdir("/sys/class/net"):
        mac = Path(f"/sys/class/net/{name}/address").read_text().strip()
        if name != "lo" and mac and mac != "00:00:00:00:00:00":
            import subprocess

            out = subprocess.run(
                ["ip", "-4", "-o", "addr", "show", name], capture_output=True, text=True
            ).stdout.split()
            if "inet" in out:
                ip = out[out.index("inet") + 1].split("/")[0]
                assert mac_of_ipv4(ip) == int(mac.replace(":", ""), 16)


def _two_threads(emulator, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Allreduce ``inputs`` (one per rank) with one blocking context per thread."""
    out: list = [None] * len(inputs)

    def worker(rank: int) -> None:
        with hostlib.connect(
            emulator.switch,
            emulator.control,
            rank=rank,
            world_size=len(inputs),
            packet_size=3,
            session_id=4242,
        ) as c:
            out[rank] = (c.allreduce(inputs[rank]), c._actx.can_block, c.last_stats)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(o is not None for o in out), "a worker thread did not finish"
    return out


def test_blocking_wait_and_event_loop_give_the_same_bytes(emulator, monkeypatch):
    # Context.allreduce waits in compiled code (poll + pump, GIL released, so two
    # contexts in two threads of one process make progress together); with
    # SWITCHML_POLL=0 it runs the event loop instead. Same packets, same results.
    n, nv = 100_003, 256
    ints = [rank_input(r, n, 0, np.int32) for r in range(2)]
    floats = [rank_input(r, n, 1, np.float32) for r in range(2)]
    got = {}
    for poll in ("1", "0"):
        monkeypatch.setenv("SWITCHML_POLL", poll)
        got[poll] = (_two_threads(emulator, ints), _two_threads(emulator, floats))
        for y, blocking, stats in got[poll][0]:
            np.testing.assert_array_equal(y, expected(2, n, 0))
            assert blocking == (poll == "1")
            assert stats["results"] == (n + nv - 1) // nv and stats["wakeups"] > 0
    floats_out = [y for poll in got for y, _, _ in got[poll][1]]
    assert all(y.tobytes() == floats_out[0].tobytes() for y in floats_out)
    exact = floats[0].astype(np.float64) + floats[1]
    m = np.maximum(np.abs(floats[0]), np.abs(floats[1]))
    bound = np.repeat(error_bound(np.maximum.reduceat(m, np.arange(0, n, nv)), 2), nv)[:n]
    assert np.all(np.abs(floats_out[0] - exact) <= bound)


def test_ctrl_c_interrupts_a_blocked_allreduce(emulator):
    # a worker waiting in compiled code for a switch that never answers still
    # takes SIGINT at once (the wait returns to Python every 100 ms), not after
    # no_progress (60 s)
    code = (
        "import faulthandler, signal, sys, numpy as np, hostlib\n"
        "faulthandler.register(signal.SIGUSR1)\n"
        f"c = hostlib.connect(switch='127.0.0.1:9', control='{emulator.control}', no_progress=60)\n"
        "c.open()\n"
        "status = open('/proc/self/status').read().split('\\n')\n"
        "handler = signal.getsignal(signal.SIGINT)\n"
        "print('waiting', getattr(handler, '__name__', handler),\n"
        "      *[x.split()[1] for x in status if x.startswith(('SigBlk', 'SigIgn'))], flush=True)\n"
        "try:\n"
        "    c.allreduce(np.ones(1000, np.int32))\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', c._actx.can_block, flush=True); sys.exit(3)\n"
    )
    # started with SIGINT at its default action whatever this process inherited
    # (a suite run as a background job of a non-interactive shell ignores it)
    with Watched([sys.executable, "-c", code], name="the worker", stdout=subprocess.PIPE) as child:
        first = child.readline(300, "the worker to join").split()
        # hostlib neither blocked nor ignored SIGINT on its way into the wait
        assert first[:2] == ["waiting", "default_int_handler"], first
        assert int(first[2], 16) & 2 == 0 and int(first[3], 16) & 2 == 0, first
        # open() compiled everything (no signal can land in Numba's compiler,
        # where ctypes would swallow it); repeat the signal on a loaded machine
        # until the child says it was interrupted, then let it exit in peace
        said = ""
        for _ in range(12):
            time.sleep(0.5)
            child.send_signal(signal.SIGINT)
            try:
                said = child.readline(4, "its answer to SIGINT").strip()
                break
            except ChildFailed:
                if child.poll() is not None:  # it exited instead of answering
                    raise
        if not said:  # still waiting: say where it is
            child.send_signal(signal.SIGUSR1)
            time.sleep(1)
            child.kill()
        assert said == "interrupted True", child.report()
        child.expect(3, 60, "it to exit after the interrupt")
