"""16-bit values end to end (docs/protocol.md §4.2): hostlib workers in processes, a
real emulator, and a controller that does not know the format."""

from __future__ import annotations

import numpy as np
import pytest
import workers
from workers import half_input

import hostlib
import swemu
from hostlib.pytest_plugin import run_workers
from hostlib.quant import bfloat16_bits, error_bound, error_bound16, simulate_allreduce16
from swemu.core.engine import EngineConfig
from swemu.launch import EmulatorProcess
from swemu.observe.stats import fetch_stats
from swemu.protocol import wire
from swemu.serving.control_plane import SessionService


@pytest.fixture(scope="module")
def emulator():
    with EmulatorProcess("--pool-size", "1024") as emu:
        yield emu


def test_float16_bfloat16_and_float32_on_the_16_bit_wire(emulator) -> None:
    """Every worker gets the twin's result bit for bit, in its tensor's type, within
    the bound; a 16-bit call sends half the packets of the same tensor on the 32-bit
    wire; int32 stays exact in the same job."""
    w, n = 3, 100_000
    results = run_workers(emulator.switch, emulator.control, w, workers.values16_calls, n)
    xs = [half_input(r, n) for r in range(w)]
    chunk = wire.values16_per_packet(wire.EMULATOR_SIZE_CODE)
    want = {
        "float16": simulate_allreduce16([x.astype(np.float16) for x in xs], chunk),
        "float32": simulate_allreduce16(xs, chunk),
        "bfloat16": simulate_allreduce16([bfloat16_bits(x) for x in xs], chunk, bfloat16=True),
    }
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for res in results:
        assert res["available"]
        for name, y in want.items():
            assert res[name].dtype == y.dtype, name
            np.testing.assert_array_equal(
                res[name].view(np.uint16 if y.itemsize == 2 else np.uint32),
                y.view(np.uint16 if y.itemsize == 2 else np.uint32),
            )
        m = np.abs(np.stack(xs)).max(axis=0)
        per_chunk = np.repeat(np.maximum.reduceat(m, np.arange(0, n, chunk)), chunk)[:n]
        assert np.all(np.abs(res["float32"] - exact) <= error_bound16(per_chunk, w))
        # the 32-bit wire: §4's bound (and the float16 rounding), twice the packets
        on32 = res["float16_on_32"].astype(np.float64)
        exact16 = np.sum([x.astype(np.float16).astype(np.float64) for x in xs], axis=0)
        m16 = np.repeat(np.maximum.reduceat(m, np.arange(0, n, chunk // 2)), chunk // 2)[:n]
        assert np.all(
            np.abs(on32 - exact16) <= error_bound(m16, w) + 2.0**-11 * np.abs(exact16) + 2.0**-25
        )
        assert res["float16_on_32_sent"] >= 2 * res["float16_sent"] - 64
        np.testing.assert_array_equal(res["int32"], w * np.arange(n, dtype=np.int32))


def test_two_bytes_a_value_on_the_switchs_counters(emulator) -> None:
    """The emulator's own counters: the new contributions of a float16 allreduce of
    n values are ⌈n / 2N⌉ data packets of 4N payload bytes, 2 bytes a value, from
    each worker, plus one exponent window (K packets) per call."""
    w, n = 2, 1 << 22
    results = run_workers(
        emulator.switch, emulator.control, w, workers.float16_once, n, release=False
    )
    job = next(j for j in fetch_stats(emulator.control)["jobs"] if j["session_id"] == results[0])
    c = job["counters"]
    chunk = wire.values16_per_packet(job["size_code"])
    data_packets = -(-n // chunk)
    assert c["aggregated"] == w * (data_packets + job["pool_size"])  # + the exponent window
    payload = 4 * wire.values_per_packet(job["size_code"])
    assert data_packets * payload == 2 * n  # 2 bytes a value
    assert c["pkts_in"] == c["aggregated"] + c["retransmissions"]
    assert c["bytes_in"] == c["pkts_in"] * wire.packet_len(job["size_code"])


async def test_a_controller_without_the_format(monkeypatch) -> None:
    """A controller that ignores value_formats and does not answer it (as
    p4app-switchML's): float16 tensors go on the 32-bit wire, values16=True too,
    and the results are right."""
    original = SessionService.UdpSession

    async def p4app_like(self, request, context):
        request.ClearField("value_formats")
        reply = await original(self, request, context)
        reply.ClearField("value_formats")
        return reply

    monkeypatch.setattr(SessionService, "UdpSession", p4app_like)
    async with swemu.serve(config=EngineConfig(pool_size=64)) as emu:
        switch, control = "%s:%d" % emu.data_address, "%s:%d" % emu.control_address
        async with hostlib.aconnect(switch, control, packet_size=1, window=8) as actx:
            assert not actx.values16_available
            x = np.linspace(-1, 1, 1000).astype(np.float16)
            y = await actx.allreduce(x)
            z = await actx.allreduce(x.astype(np.float32), values16=True)
            assert y.dtype == np.float16 and z.dtype == np.float32
            np.testing.assert_allclose(y, x, atol=1e-3)
            np.testing.assert_allclose(z, x.astype(np.float32), atol=1e-6)
            counters = emu.engine.job_counters_of(actx.membership.session_id)
            assert counters["pkts_in"] == 2 * (-(-1000 // 64) + 8)  # 64 values a packet: 32-bit


def test_bad_calls(emulator) -> None:
    with hostlib.connect(emulator.switch, emulator.control) as c:
        with pytest.raises(TypeError, match="int32 sums are exact"):
            c.allreduce(np.ones(3, np.int32), values16=True)
        with pytest.raises(TypeError, match="16-bit patterns"):
            c.allreduce(np.ones(3, np.float32), bfloat16=True)
        with pytest.raises(ValueError, match="float16 input contains NaN"):
            c.allreduce(np.array([1, np.nan], np.float16))
        y = c.allreduce(np.ones(5, np.float16), out=np.empty(5, np.float16))
        assert y.tolist() == [1.0] * 5
