"""The Tofino target's share of the register pool at both hardware size codes.

p4/switchml.p4 keeps a size-code-1 slot in one register entry and a size-code-3 slot
in four consecutive ones (a quarter of its 256 values each; p4/checks.p4). The
controller must give a job that many entries, zero the bitmap and count registers
over all of them, and refuse what does not fit -- checked here through the recording
BF Runtime client, which refuses any name or width the program does not have.
"""

from __future__ import annotations

from typing import Any

import pytest

from p4.controller import RecordingBfrt, TofinoTarget, WorkerPort, load_schema
from p4.controller import bfrt_target as bt
from swemu.core.controller import RegistrationError, SessionController

SCHEMA = load_schema()


def controller() -> tuple[SessionController, RecordingBfrt]:
    rec = RecordingBfrt(SCHEMA)
    target = TofinoTarget(
        rec.bfrt_info, rec.gc, rec.device, default_port=WorkerPort(3, 0x020000000099)
    )
    return SessionController(target), rec


def register(c: SessionController, sid: int, code: int, pool: int, **kw: Any) -> Any:
    return c.register(
        session_id=sid,
        rank=kw.pop("rank", 0),
        num_workers=kw.pop("num_workers", 1),
        ipv4=0x0A000000 + sid,
        udp_port=5000 + sid,
        packet_size=code,
        pool_size=pool,
        mac=0x020000000000 + sid,
    )


def zeroed(rec: RecordingBfrt, table: str) -> set[int]:
    """Register indices written with zeros."""
    out = set()
    for w in rec.writes:
        if w.table == table and w.op == "entry_mod":
            for key, data in w.entries:
                assert data is not None
                assert not any(v for n, v in data.items() if n != "is_default_entry")
                out.add(key["$REGISTER_INDEX"]["value"])
    return out


def test_size_code_3_job_takes_four_entries_per_slot() -> None:
    c, rec = controller()
    register(c, 1, 1, 100)  # entries [0, 100)
    register(c, 2, 3, 50)  # entries [100, 300)
    register(c, 3, 1, 10)  # entries [300, 310)
    jobs = c.read_state()["target"]["jobs"]
    assert {sid: j["pool_base"] for sid, j in jobs.items()} == {1: 0, 2: 100, 3: 300}
    assert zeroed(rec, bt.WORKER_BITMAP) == set(range(310))
    assert zeroed(rec, bt.COUNT) == set(range(620))
    (_, data) = next((k, d) for k, d in rec.entries(bt.WORKER_BY_ADDRESS) if d["size_code"] == 3)
    assert (data["pool_base"], data["pool_size"]) == (100, 50)


def test_released_size_code_3_range_is_reused_first_fit() -> None:
    c, _ = controller()
    register(c, 1, 3, 10)  # [0, 40)
    register(c, 2, 1, 8)  # [40, 48)
    c.release(1)
    register(c, 3, 1, 40)  # fills [0, 40)
    register(c, 4, 3, 1)  # [48, 52)
    jobs = c.read_state()["target"]["jobs"]
    assert {sid: j["pool_base"] for sid, j in jobs.items()} == {2: 40, 3: 0, 4: 48}


def test_pool_refusals_count_entries() -> None:
    """A size-code-3 job fits a quarter of the slots; the refusal says so."""
    c, _ = controller()
    register(c, 1, 3, bt.NUM_POOL_SLOTS // 4)  # the whole pool
    with pytest.raises(
        RegistrationError, match=r"no free range of 4 entries \(1 slots at size code 3\)"
    ) as info:
        register(c, 2, 3, 1)
    assert info.value.code == "RESOURCE_EXHAUSTED"
    with pytest.raises(RegistrationError, match="no free range of 1 slots"):
        register(c, 2, 1, 1)
    c2, _ = controller()
    with pytest.raises(RegistrationError, match=r"no free range of 8196 entries"):
        register(c2, 1, 3, bt.NUM_POOL_SLOTS // 4 + 1)
    with pytest.raises(RegistrationError, match="packet_size 2 is not supported"):
        register(c2, 1, 2, 1)
