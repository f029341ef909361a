"""swemu.observe.decode: captures become per-slot timelines with the switch's own view.

Small hand-built exchanges check each classification rule with the expected
kinds written out from the scenario; a simulated run through the real
:class:`swemu.core.engine.SwitchEngine`, recorded the way a server would record it,
checks that the decoder agrees with every action the switch took.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from swemu.observe.decode import (
    CONTRIBUTION,
    FROM_SWITCH,
    MALFORMED,
    MULTICAST,
    RETRANSMISSION,
    TO_SWITCH,
    UNICAST,
    Event,
    render_timeline,
    summary,
    timeline,
)
from swemu.observe.pcap import PcapWriter, read_pcap
from swemu.protocol import wire

IP = wire.ipv4_to_int
SWITCH = (IP("10.0.0.100"), 0xBEE3)
A = (IP("10.0.0.1"), 40001)
B = (IP("10.0.0.2"), 40002)
SLOT, TSI, JOB = 4242, 123457, 3
OTHER_SLOT, OTHER_TSI = 17, 98765
T0 = 1_700_000_000.0


def pkt(
    slot: int = SLOT, tsi: int = TSI, set_: int = 0, job: int = JOB, fill: int = 1, e0: int = 0
) -> bytes:
    return wire.encode(
        size_code=0,
        job_number=job,
        tsi=tsi,
        set=set_,
        slot=slot,
        e0=e0,
        values=np.arange(32) * fill,
    )


def capture(tmp_path: Path, traffic, **kw) -> list[Event]:
    """Write ``(data, src, dst, dt)`` with PcapWriter, read it back, decode it."""
    path = tmp_path / "x.pcap"
    with PcapWriter(path, **kw) as w:
        for data, src, dst, dt in traffic:
            assert w.write(data, src, dst, T0 + dt)
    return timeline(read_pcap(path))


def exchange() -> list[tuple[bytes, tuple, tuple, float]]:
    """The brief's exchange on one slot, plus another slot and a DNS packet."""
    result = pkt(fill=3)
    return [
        (b"\x00" * 30, A, (IP("8.8.8.8"), 53), -0.5),  # not SwitchML: ignored
        (pkt(fill=1), A, SWITCH, 0.0),
        (pkt(fill=2), B, SWITCH, 0.001),
        (result, SWITCH, A, 0.00105),
        (result, SWITCH, B, 0.00106),
        (pkt(fill=1), A, SWITCH, 0.050),  # A lost its result and resends
        (result, SWITCH, A, 0.05002),
        (b"\x10\x00\x01", B, SWITCH, 0.060),  # malformed: shorter than a header
        (pkt(OTHER_SLOT, OTHER_TSI, fill=5), A, SWITCH, 0.070),
    ]


def test_exchange_classification(tmp_path: Path) -> None:
    events = capture(tmp_path, exchange())
    got = [(e.kind, e.direction, e.worker) for e in events]
    assert got == [
        (CONTRIBUTION, TO_SWITCH, A),
        (CONTRIBUTION, TO_SWITCH, B),
        (MULTICAST, FROM_SWITCH, A),
        (MULTICAST, FROM_SWITCH, B),
        (RETRANSMISSION, TO_SWITCH, A),
        (UNICAST, FROM_SWITCH, A),
        (MALFORMED, TO_SWITCH, B),
        (CONTRIBUTION, TO_SWITCH, A),
    ]
    assert [e.frame for e in events] == list(range(2, 10))  # frame 1 is the DNS packet
    assert all(e.switch == SWITCH for e in events)
    assert events[0].time == 0.0 and events[5].time == pytest.approx(0.05002, abs=2e-6)
    first = events[0]
    assert (first.set, first.slot, first.tsi, first.job_number) == (0, SLOT, TSI, JOB)
    assert first.values == (0, 1, 2, 3) and events[2].values == (0, 3, 6, 9)
    assert events[2].group == events[3].group == 0 and events[2].fanout == 2
    assert events[5].group is None and events[5].fanout == 1
    assert events[6].slot is None and "shorter than" in events[6].note


def test_exchange_summary(tmp_path: Path) -> None:
    s = summary(capture(tmp_path, exchange()))
    a, b = "10.0.0.1:40001", "10.0.0.2:40002"
    assert s["workers"][a] == {
        "packets": 3,
        "contributions": 2,
        "retransmissions": 1,
        "results_multicast": 1,
        "results_unicast": 1,
        "malformed": 0,
    }
    assert s["workers"][b] == {
        "packets": 2,
        "contributions": 1,
        "retransmissions": 0,
        "results_multicast": 1,
        "results_unicast": 0,
        "malformed": 1,
    }
    assert s["results"] == {"multicast": 1, "multicast_packets": 2, "unicast": 1}
    assert (s["malformed"], s["retransmissions"], s["events"], s["slots"]) == (1, 1, 8, 2)
    assert s["switches"] == ["10.0.0.100:48867"]
    json.dumps(s)  # JSON-ready, for --json


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_render_timeline(tmp_path: Path) -> None:
    events = capture(tmp_path, exchange())
    text = render(render_timeline(events))
    for needle in (
        str(TSI),
        str(OTHER_TSI),
        f"{SWITCH[1]:#x}:{SLOT}",
        f"{SWITCH[1]:#x}:{OTHER_SLOT}",
        "10.0.0.1:40001",
        "result (multicast)",
        "result (unicast)",
        "retransmission",
        "malformed",
        "shorter than",
    ):
        assert needle in text, needle
    # sections in slot order: slot 17 comes before slot 4242 although it was sent last
    assert text.index(f":{OTHER_SLOT}") < text.index(f":{SLOT}")

    one = render(render_timeline(events, slot=OTHER_SLOT))
    assert str(OTHER_TSI) in one and str(TSI) not in one and "malformed" not in one

    head = render(render_timeline(events, limit=2))
    assert "2 of 8 events" in head and "6 more events" in head
    assert "result (multicast)" not in head  # results come third and fourth


def test_event_to_dict_is_json_ready(tmp_path: Path) -> None:
    events = capture(tmp_path, exchange())
    d = json.loads(json.dumps([e.to_dict() for e in events]))
    assert d[0]["worker"] == "10.0.0.1:40001" and d[0]["switch"] == "10.0.0.100:48867"
    assert d[0]["tsi"] == TSI and d[0]["values"] == [0, 1, 2, 3]
    assert d[6]["kind"] == "malformed" and d[6]["slot"] is None


def test_single_worker_job_multicasts_to_one(tmp_path: Path) -> None:
    """With W = 1 every new packet completes its slot: a multicast that reaches one worker."""
    r = pkt(fill=1)
    events = capture(
        tmp_path,
        [
            (pkt(), A, SWITCH, 0.0),
            (r, SWITCH, A, 0.0001),
            (pkt(), A, SWITCH, 0.01),
            (r, SWITCH, A, 0.0101),
        ],
    )
    assert [e.kind for e in events] == [CONTRIBUTION, MULTICAST, RETRANSMISSION, UNICAST]
    assert events[1].fanout == 1


def test_set_reuse_is_flagged(tmp_path: Path) -> None:
    """A worker that forgets to flip the set looks like a retransmission to the switch."""
    events = capture(
        tmp_path,
        [
            (pkt(tsi=1, set_=0), A, SWITCH, 0.0),
            (pkt(tsi=1, set_=0, fill=9), SWITCH, A, 0.001),
            (pkt(tsi=2, set_=1), A, SWITCH, 0.002),  # correct: next chunk, flipped set
            (pkt(tsi=2, set_=1, fill=9), SWITCH, A, 0.003),
            (pkt(tsi=1, set_=1, job=JOB + 1), A, SWITCH, 0.004),  # next call, same set again: bug
            (pkt(tsi=1, set_=0, job=JOB + 1), A, SWITCH, 0.005),  # flipped: fine
        ],
    )
    kinds = [e.kind for e in events]
    assert kinds == [CONTRIBUTION, MULTICAST, CONTRIBUTION, MULTICAST, RETRANSMISSION, CONTRIBUTION]
    assert "not flipped" in events[4].note and "tsi 2" in events[4].note
    assert all("not flipped" not in e.note for i, e in enumerate(events) if i != 4)


def test_multicast_copies_are_grouped_by_bytes_and_instant(tmp_path: Path) -> None:
    r1, r2 = pkt(fill=7), pkt(slot=5, tsi=9, fill=7)
    events = capture(
        tmp_path,
        [
            (pkt(), A, SWITCH, 0.0),
            (pkt(), B, SWITCH, 0.0),
            (pkt(slot=5, tsi=9), A, SWITCH, 0.0),
            (pkt(slot=5, tsi=9), B, SWITCH, 0.0),
            # two multicasts interleaved: grouped by their bytes
            (r1, SWITCH, A, 0.001),
            (r2, SWITCH, A, 0.001),
            (r2, SWITCH, B, 0.001),
            (r1, SWITCH, B, 0.001),
        ],
    )
    res = events[4:]
    assert all(e.kind == MULTICAST and e.fanout == 2 for e in res)
    assert res[0].group == res[3].group != res[1].group == res[2].group
    assert summary(events)["results"]["multicast"] == 2
    # a copy too late, or with other bytes, is not part of the multicast: it is a unicast
    late = capture(
        tmp_path,
        [
            (pkt(), A, SWITCH, 0.0),
            (pkt(), B, SWITCH, 0.0),
            (r1, SWITCH, A, 0.0001),
            (r1, SWITCH, B, 0.2),
        ],
    )
    assert [e.kind for e in late[2:]] == [MULTICAST, UNICAST] and late[2].fanout == 1
    other = capture(
        tmp_path,
        [
            (pkt(), A, SWITCH, 0.0),
            (pkt(), B, SWITCH, 0.0),
            (r1, SWITCH, A, 0.0001),
            (pkt(fill=8), SWITCH, B, 0.0001),
        ],
    )
    assert [e.kind for e in other[2:]] == [MULTICAST, UNICAST]


def test_unicasts_to_several_workers_are_not_a_multicast(tmp_path: Path) -> None:
    """Two workers retransmit into a complete slot in the same instant: the switch
    answers each with the same bytes, but the round's multicast was already sent."""
    r = pkt(fill=3)
    events = capture(
        tmp_path,
        [
            (pkt(), A, SWITCH, 0.0),
            (pkt(), B, SWITCH, 0.0),
            (r, SWITCH, A, 0.0001),
            (r, SWITCH, B, 0.0001),
            (pkt(), A, SWITCH, 0.05),
            (pkt(), B, SWITCH, 0.05),
            (r, SWITCH, A, 0.0501),
            (r, SWITCH, B, 0.0501),
        ],
    )
    assert [e.kind for e in events[4:]] == [RETRANSMISSION] * 2 + [UNICAST] * 2
    assert summary(events)["results"] == {"multicast": 1, "multicast_packets": 2, "unicast": 2}


def test_each_round_of_a_set_has_its_own_multicast(tmp_path: Path) -> None:
    traffic = []
    for i, tsi in enumerate((1, 2, 3)):  # sets 0, 1, 0: the third round reuses set 0
        t, s = i * 0.01, tsi % 2 ^ 1
        traffic += [
            (pkt(tsi=tsi, set_=s), A, SWITCH, t),
            (pkt(tsi=tsi, set_=s), B, SWITCH, t),
            (pkt(tsi=tsi, set_=s, fill=3), SWITCH, A, t + 0.001),
            (pkt(tsi=tsi, set_=s, fill=3), SWITCH, B, t + 0.001),
        ]
    events = capture(tmp_path, traffic)
    assert [e.kind for e in events] == [CONTRIBUTION] * 2 + [MULTICAST] * 2 + (
        [CONTRIBUTION] * 2 + [MULTICAST] * 2
    ) * 2
    assert [e.group for e in events if e.kind == MULTICAST] == [0, 0, 1, 1, 2, 2]


def test_worker_side_capture(tmp_path: Path) -> None:
    """On a worker host only its own copy shows: a retransmission that is still
    pending, then the multicast another worker's packet triggered."""
    r = pkt(fill=3)
    events = capture(
        tmp_path,
        [
            (pkt(), A, SWITCH, 0.0),
            (pkt(), A, SWITCH, 0.01),
            (r, SWITCH, A, 0.012),
            (r, SWITCH, A, 0.02),
        ],
    )
    assert [e.kind for e in events] == [CONTRIBUTION, RETRANSMISSION, MULTICAST, UNICAST]


def test_truncated_and_odd_packets_never_crash(tmp_path: Path) -> None:
    long = wire.encode(size_code=3, job_number=0, tsi=0, set=0, slot=0, values=np.zeros(256))
    bad_type = bytes([0x20]) + pkt()[1:]
    exp = pkt(tsi=wire.EXP_TSI_BASE + 5, e0=-7)
    worker_on_switch_port = (IP("10.0.0.7"), 0xBEE1)  # both ports in 0xBEE0-0xBEEF
    events = capture(
        tmp_path,
        [
            (long, A, SWITCH, 0.0),
            (bad_type, A, SWITCH, 0.1),
            (b"", B, SWITCH, 0.2),
            (pkt() + b"\x00" * 4, B, SWITCH, 0.3),
            (exp, A, SWITCH, 0.4),
            (pkt(slot=1), worker_on_switch_port, SWITCH, 0.5),
            (pkt(slot=1), SWITCH, worker_on_switch_port, 0.6),
        ],
        snaplen=500,
    )
    assert [e.kind for e in events] == [MALFORMED] * 4 + [CONTRIBUTION, CONTRIBUTION, MULTICAST]
    assert events[0].note.startswith("truncated in the capture")
    assert "msg_type 2" in events[1].note
    assert events[4].e0 == -7 and "exponent packet of chunk 5" in events[4].note
    assert events[5].direction == TO_SWITCH and events[6].direction == FROM_SWITCH
    assert events[6].worker == worker_on_switch_port
    render(render_timeline(events))  # renders malformed rows too


def test_empty_capture(tmp_path: Path) -> None:
    events = capture(tmp_path, [(b"x", A, (1, 53), 0.0)])
    assert events == []
    assert summary(events)["events"] == 0
    assert "0 of 0 events" in render(render_timeline(events))


# ----------------------------------------------------- against the real switch
@pytest.mark.parametrize("seed", [0, 1])
def test_decoder_agrees_with_the_switch(tmp_path: Path, seed: int) -> None:
    """Workers with lossy links run through SwitchEngine; the capture is recorded
    as a server would (input rows, then result rows per destination). Every
    decoded event must match the action the switch took for it."""
    from swemu.core.engine import Action, Batch, SwitchEngine

    rng = np.random.default_rng(seed)
    num_workers, pool, chunks, loss = 3, 4, 24, 0.25
    workers = [(IP(f"10.0.1.{w + 1}"), 41000 + w) for w in range(num_workers)]
    switch = (IP("10.0.0.100"), wire.DEFAULT_UDP_PORT)
    engine = SwitchEngine()
    for rank, (ip, port) in enumerate(workers):
        engine.register(
            session_id=7,
            rank=rank,
            num_workers=num_workers,
            ipv4=ip,
            udp_port=port,
            packet_size=0,
            pool_size=pool,
        )
    # per worker and slot: the chunk it works on (None when done) and the set it uses
    chunk = [[s if s < chunks else None for s in range(pool)] for _ in workers]
    sets = [[0] * pool for _ in workers]
    expected: list[str] = []
    path = tmp_path / "run.pcap"
    batch = Batch(capacity=num_workers * pool + 1)
    with PcapWriter(path) as cap:
        for tick in range(400):
            if all(c is None for row in chunk for c in row):
                break
            batch.n = 0
            sends = [
                (w, s)
                for w in range(num_workers)
                for s in range(pool)
                if chunk[w][s] is not None and rng.random() > loss
            ]
            rng.shuffle(sends)
            for w, s in sends:
                c = chunk[w][s]
                batch.add(
                    wire.encode(
                        size_code=0,
                        job_number=1,
                        tsi=c,
                        set=sets[w][s],
                        slot=s,
                        values=np.full(32, w + c),
                    ),
                    *workers[w],
                )
            if rng.random() < 0.2:  # now and then a malformed packet from a registered worker
                batch.add(b"\x10\x00\x00", *workers[int(rng.integers(num_workers))])
            if batch.n == 0:
                continue
            ts = 1000.0 + tick * 0.01
            engine.process(batch, now=ts)
            n, nd = batch.n, batch.n_dest
            cap.write_batch(
                batch.buf[:n], batch.lens[:n], batch.ip[:n], batch.port[:n], *switch, ts
            )
            cap.write_batch(
                batch.out_buf,
                batch.out_len,
                *switch,
                batch.dest_ip[:nd],
                batch.dest_port[:nd],
                ts + 1e-5,
                rows=batch.dest_row[:nd],
            )
            by_action = {
                Action.AGGREGATED: CONTRIBUTION,
                Action.MULTICAST: CONTRIBUTION,
                Action.RETRANSMIT_PENDING: RETRANSMISSION,
                Action.UNICAST: RETRANSMISSION,
                Action.DROP_MALFORMED: MALFORMED,
            }
            expected += [by_action[Action(int(a))] for a in batch.action[:n]]
            for d in range(nd):
                row = int(batch.dest_row[d])
                sent = Action(int(batch.action[row]))
                expected.append(MULTICAST if sent == Action.MULTICAST else UNICAST)
                if rng.random() < loss:
                    continue  # the result is lost on the way to the worker
                res = wire.decode(batch.out_buf[row, : batch.out_len[row]].tobytes())
                w = workers.index((int(batch.dest_ip[d]), int(batch.dest_port[d])))
                if chunk[w][res.slot] == res.tsi and sets[w][res.slot] == res.set:
                    nxt = res.tsi + pool
                    chunk[w][res.slot] = nxt if nxt < chunks else None
                    sets[w][res.slot] ^= 1
        else:
            pytest.fail("the simulated allreduce did not finish")
    events = timeline(read_pcap(path))
    assert [e.kind for e in events] == expected
    kinds = set(expected)
    assert {CONTRIBUTION, RETRANSMISSION, MULTICAST, UNICAST, MALFORMED} <= kinds
    s = summary(events)
    assert s["results"]["multicast_packets"] == num_workers * s["results"]["multicast"]
    assert s["results"]["multicast"] == chunks


# ------------------------------------------------- the switch's port, inferred
def test_infer_switch_ports() -> None:
    from swemu.observe.decode import infer_switch_ports

    # three workers and a switch on 48890: the switch's port is in every packet
    sport = [40001, 40002, 40003, 48890, 48890, 48890]
    dport = [48890, 48890, 48890, 40001, 40002, 40003]
    assert infer_switch_ports(sport, dport) == {48890}
    # two shards (two switch ports), each with its workers
    two = infer_switch_ports([1, 2, 9000, 9000, 3, 4, 9001], [9000, 9000, 1, 2, 9001, 9001, 3])
    assert two == {9000, 9001}
    # one worker: a tie, won by the destination of the first packet (workers speak first)
    assert infer_switch_ports([40001, 48890, 40001], [48890, 40001, 48890]) == {48890}
    assert infer_switch_ports([48890, 40001], [40001, 48890]) == {40001}  # mid-stream: fooled
    # ... or by a port of 0xBEE0-0xBEEF
    assert infer_switch_ports([48890, 0xBEE5], [0xBEE5, 48890]) == {0xBEE5}
    # packets explained by known ports are left out
    assert infer_switch_ports([1, 0xBEE0, 7, 7], [0xBEE0, 1, 5000, 5001], known=[0xBEE0]) == {7}
    assert infer_switch_ports([], []) == set()


def test_switch_on_any_port(tmp_path: Path) -> None:
    """A switch on 48890 (`serve --port 48890`) is found without being told."""
    sw = (SWITCH[0], 48890)
    traffic = [
        (d, sw if s == SWITCH else s, sw if t == SWITCH else t, dt) for d, s, t, dt in exchange()
    ]
    want = [e.kind for e in capture(tmp_path, exchange())]
    events = capture(tmp_path, traffic)
    assert [e.kind for e in events] == want
    assert all(e.switch == sw for e in events)
    # told the wrong port, the decoder sees no SwitchML traffic; told the right one, all of it
    path = tmp_path / "x.pcap"
    assert timeline(read_pcap(path), ports=[0xBEE0]) == []
    assert len(timeline(read_pcap(path), ports=[48890])) == len(events)


def test_decoder_streams_and_holds_multicasts_until_final(tmp_path: Path) -> None:
    """Events come out batch by batch, but a result only once no copy can follow
    (its fanout is final); a burst in one instant is released at ``hold``."""
    from swemu.observe.decode import Decoder
    from swemu.observe.pcap import read_pcap_batches

    path = tmp_path / "s.pcap"
    with PcapWriter(path) as w:
        for i in range(40):  # 20 rounds of slot 0, 10 ms apart, sets alternating
            t = T0 + i // 2 * 0.01
            if i % 2 == 0:
                w.write(pkt(slot=0, tsi=i, set_=i // 2 % 2), A, SWITCH, t)
            else:
                w.write(pkt(slot=0, tsi=i - 1, set_=i // 2 % 2, fill=2), SWITCH, A, t + 0.0005)
        w.write(pkt(slot=0, tsi=38, set_=1, fill=2), SWITCH, B, T0 + 0.19 + 0.0008)
    dec = Decoder()
    batches = read_pcap_batches(path, chunk_bytes=2000)  # 13 records a batch
    first = dec.feed(next(batches))
    assert 0 < len(first) < 13  # the last round of the batch is held
    streamed = first + [e for b in batches for e in dec.feed(b)]
    assert len(streamed) < 41  # the last round waits for the end
    streamed += dec.finish()
    events = timeline(read_pcap(path))
    assert [e.frame for e in streamed] == [e.frame for e in events] == list(range(1, 42))
    assert [(e.kind, e.fanout) for e in streamed] == [(e.kind, e.fanout) for e in events]
    assert events[-2].fanout == 2 and events[-1].kind == MULTICAST  # B's copy joined A's

    burst = Decoder(hold=4)
    with PcapWriter(tmp_path / "b.pcap") as w:
        for s in range(10):
            w.write(pkt(slot=s), A, SWITCH, T0)  # all in one instant
    got = burst.feed(next(read_pcap_batches(tmp_path / "b.pcap")))
    assert len(got) == 6 and len(burst.finish()) == 4


# ------------------------------------------------------------------- the CLI
def test_decode_cli_streams_and_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`switchml-emu decode big.pcap | head`: the first rows come, the pipe closes,
    the command ends with status 0 and says nothing on stderr."""
    import os
    import sys

    from swemu.launch import Watched, child_env

    path = tmp_path / "big.pcap"
    n = 20_000
    buf = np.zeros((n, wire.packet_len(0)), np.uint8)
    buf[:] = np.frombuffer(pkt(), np.uint8)
    rank = np.arange(n) % 4
    with PcapWriter(path, max_packets=None) as w:
        w.write_batch(buf, np.full(n, buf.shape[1]), 0x0A000001 + rank, 40000 + rank, *SWITCH, T0)
    cmd = [sys.executable, "-c", "from cli.main import emu_main; emu_main()", "decode", str(path)]
    read, write = os.pipe()
    with (
        open(read, "rb") as pipe,
        Watched(cmd, name="decode", stdout=write, env=child_env()) as proc,
    ):
        os.close(write)
        head = [pipe.readline() for _ in range(3)]  # b"" at once if it exited
        pipe.close()  # as `head -3` does
        assert proc.expect(0, 120, "it to stop once its reader went away") == ""
    assert b"port:slot" in head[0] and b"0xbee3:4242" in head[1] and b"contribution" in head[1]


def test_decode_cli_port_and_no_packets(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli.main import emu as emu_cli

    sw = (SWITCH[0], 48890)
    path = tmp_path / "p.pcap"
    with PcapWriter(path) as w:
        w.write(pkt(), A, sw, T0)
        w.write(pkt(fill=1), sw, A, T0 + 0.001)
    run = CliRunner(catch_exceptions=False).invoke
    r = run(emu_cli, ["decode", str(path)])
    assert r.exit_code == 0 and "48890:4242" in r.output and "2 of 2 events" in r.output
    r = run(emu_cli, ["decode", str(path), "--port", "48890", "--json"])
    doc = json.loads(r.output)
    assert [e["kind"] for e in doc["events"]] == [CONTRIBUTION, MULTICAST]
    assert doc["summary"]["switches"] == ["10.0.0.100:48890"]
    r = run(emu_cli, ["decode", str(path), "--port", "48891"])
    assert r.exit_code == 0 and "no SwitchML packets (UDP to or from port 48891)" in r.output
    r = run(emu_cli, ["decode", str(path), "--port", "48891", "--json"])
    assert json.loads(r.output)["events"] == []


# ------------------------------------------- a real emulator on an ordinary port
async def test_capture_of_a_real_switch_on_any_port(tmp_path: Path) -> None:
    """`serve --port N --pcap` with N outside 0xBEE0-0xBEEF: `switchml-emu decode`
    finds the port and agrees with the switch's own counters."""
    import asyncio

    from click.testing import CliRunner

    import hostlib
    import swemu
    from cli.main import emu as emu_cli
    from swemu.core.engine import EngineConfig

    path = tmp_path / "any.pcap"
    workers, calls = 3, 2
    x = np.arange(1000, dtype=np.int32)
    config = EngineConfig(pool_size=8, max_pool_memory=1 << 20)
    async with swemu.serve(config=config, pcap=path) as emu:
        port = emu.data_address[1]
        if port & wire.UDP_PORT_MASK == wire.UDP_PORT_BASE:
            pytest.skip("the free port the system gave is a SwitchML port")
        switch, control = "%s:%d" % emu.data_address, "%s:%d" % emu.control_address

        async def one(rank: int) -> None:
            async with hostlib.aconnect(
                switch,
                control,
                rank=rank,
                world_size=workers,
                packet_size=0,
                window=4,
                no_progress=60,
                release=False,
            ) as ctx:
                for _ in range(calls):
                    np.testing.assert_array_equal(await ctx.allreduce(x * (rank + 1)), x * 6)

        await asyncio.wait_for(asyncio.gather(*(one(r) for r in range(workers))), 60)
        snap = emu.snapshot()
    (job,) = snap["jobs"]
    r = CliRunner(catch_exceptions=False).invoke(emu_cli, ["decode", str(path), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)["summary"]
    assert s["switches"] == ["127.0.0.1:%d" % port]
    assert s["events"] == snap["counters"]["pkts_in"] + job["counters"]["pkts_out"] > 0
    assert s["results"]["multicast"] == job["counters"]["multicast"] == calls * 32
    assert s["retransmissions"] == job["counters"]["retransmissions"]
    assert len(s["workers"]) == workers and s["malformed"] == 0
    r = CliRunner(catch_exceptions=False).invoke(emu_cli, ["decode", str(path), "--limit", "5"])
    assert f"{port}:0" in r.output and "5 of" in r.output


def test_a_child_switchs_uplink_is_told_by_its_mac(tmp_path: Path) -> None:
    """A child switch's capture (docs/protocol.md §7): its workers at its port,
    its uplink U (any ports: 41000 -> 41500, neither a switch-like port) to its
    parent. The MAC 02:01:<ip> of U's end says which end is the switch, also
    where the ports would say the opposite; without it U looks like any worker."""
    child = (IP("10.0.0.100"), 0xBEE0)
    up = (IP("10.0.0.100"), 41000)
    parent = (IP("10.0.0.200"), 41500)
    total = pkt(fill=3)
    path = tmp_path / "child.pcap"
    with PcapWriter(path) as w:
        w.write(pkt(fill=1), A, child, T0)
        w.write(pkt(fill=2), B, child, T0 + 0.001)
        w.write(total, up, parent, T0 + 0.002, src_uplink=True)  # the partial aggregate
        w.write(total, up, parent, T0 + 0.050, src_uplink=True)  # resent after a timeout
        w.write(total, parent, up, T0 + 0.051, dst_uplink=True)  # the parent's result
        buf = np.frombuffer(total, np.uint8)[None, :]
        w.write_batch(
            buf, [len(total)], *child, [A[0], B[0]], [A[1], B[1]], T0 + 0.052, rows=[0, 0]
        )
        # a MAC 02:01:... whose low bytes are not the frame's IP marks nothing
        w.write_batch(buf, [len(total)], *parent, *up, T0 + 0.06, dst_uplink=[True])
    raw = path.read_bytes()
    last = raw.rfind(b"\x02\x01" + up[0].to_bytes(4, "big"))
    path.write_bytes(raw[: last + 2] + b"\x0a\x0a\x0a\x0a" + raw[last + 6 :])

    events = timeline(read_pcap(path))
    got = [(e.direction, e.kind, e.child, e.worker, e.switch) for e in events]
    assert got[:7] == [
        (TO_SWITCH, CONTRIBUTION, False, A, child),
        (TO_SWITCH, CONTRIBUTION, False, B, child),
        (TO_SWITCH, CONTRIBUTION, True, up, parent),
        (TO_SWITCH, RETRANSMISSION, True, up, parent),
        (FROM_SWITCH, MULTICAST, True, up, parent),
        (FROM_SWITCH, MULTICAST, False, A, child),
        (FROM_SWITCH, MULTICAST, False, B, child),
    ]
    assert events[2].note == "a child switch's partial aggregate"
    assert events[4].note == "to a child switch" and events[4].fanout == 1
    assert events[5].fanout == 2
    # the last packet has no mark: only the ports speak for it, and they are wrong
    # (41000, the port it was sent to, is taken for a switch's)
    assert len(events) == 8 and not events[7].child and events[7].worker == parent
    s = summary(events)
    assert s["children"] == ["10.0.0.100:41000"]
    assert s["workers"]["10.0.0.100:41000"]["contributions"] == 1
    assert s["workers"]["10.0.0.100:41000"]["retransmissions"] == 1
    # the batches carry the marks too, and a tcpdump-style MAC marks nothing
    from swemu.observe.pcap import read_pcap_batches

    (batch,) = list(read_pcap_batches(path))
    assert batch.src_uplink.tolist() == [False, False, True, True, False, False, False, False]
    assert batch.dst_uplink.tolist() == [False, False, False, False, True, False, False, False]
