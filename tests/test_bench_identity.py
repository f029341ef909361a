"""Smoke test of ``python -m bench identity`` (the measurement itself never runs in CI)."""

from __future__ import annotations

from bench import identity


def test_identity_benchmark_smoke():
    # three repetitions: the medians ride out a stall that fires a 20 ms timer once
    data = identity.run(2, 64 << 10, 3, reps=3, per_worker_ports=True, log=lambda m: None)
    modes = {r["mode"]: r for r in data["modes"]}
    assert set(modes) == {"ip-port", "ip-port-unicast", "ip", "ip-own-ports"}
    assert all(r["verified"] is True and r["median_s"] > 0 for r in modes.values())
    assert modes["ip-port"]["ratio"] == 1.0
    # the shared port needs no retransmission; a port per worker cannot do without
    assert modes["ip"]["retransmissions"] == 0
    assert modes["ip-own-ports"]["retransmissions"] > 0
    table = identity.markdown(data)
    assert "| ip |" in table and "WRONG" not in table
