"""The ``switchml`` torch.distributed backend under torchrun, against a real emulator.

One ``python -m torch.distributed.run --nproc-per-node 3`` launch of
``tests/torch_backend_worker.py`` runs every check of a process group's lifetime
(torch's start-up dominates the time, so one launch does it all); the tests
below read what each rank wrote, and the emulator's counters before and after.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from swemu.launch import EmulatorProcess, child_env, spawn  # noqa: E402
from swemu.observe.stats import fetch_stats  # noqa: E402

pytestmark = pytest.mark.torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "torch_backend_worker.py"
W = 3
LENGTHS = ("1", "7", "2049", "30011")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    out: Path,
    nproc: int,
    *args: str,
    timeout: float = 300,
    max_restarts: int = 0,
    **env: str,
):
    """``python -m torch.distributed.run --nproc-per-node N [--max-restarts R]
    worker OUT ARGS`` with ``env`` added; the finished process (stdout and
    stderr captured)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        *(["--max-restarts", str(max_restarts)] if max_restarts else []),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(WORKER),
        str(out),
        *args,
    ]
    proc = spawn(
        cmd,
        default_signals=True,  # whatever this process inherited (a background job)
        env=child_env(OMP_NUM_THREADS="1", **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # torchrun and its ranks: one process group to stop
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: torchrun passes it on to its ranks (a SIGKILL would orphan them)
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                stdout, stderr = proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        raise AssertionError(
            f"torchrun did not finish in {timeout:g} s:\n{stderr[-6000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The 3-rank launch: each rank's report, and the emulator's counters after.

    Only SWITCHML_CONTROL is set, and the emulator's UDP port is a random one:
    the ranks learn the data port from the controller's reply."""
    out = tmp_path_factory.mktemp("ranks")
    with EmulatorProcess() as emu:
        assert not emu.switch.endswith(":48864")
        proc = torchrun(out, W, SWITCHML_CONTROL=emu.control)
        after = fetch_stats(emu.control)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(W)]
    return {"ranks": ranks, "after": after}


def test_the_default_group_is_a_switchml_job(run):
    ranks = run["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    assert all(r["backend"] == "switchml" and r["world_size"] == W for r in ranks)
    # one session, agreed through torchrun's store
    assert len({r["session_id"] for r in ranks}) == 1


def test_int32_is_exact_and_the_same_on_every_rank(run):
    for n in LENGTHS:
        assert all(r["int32"][n]["exact"] for r in run["ranks"]), n
        assert len({r["int32"][n]["digest"] for r in run["ranks"]}) == 1


def test_float32_is_within_the_protocol_bound(run):
    """SUM and AVG of float32 (chunk magnitudes from 1e-6 to 1e3, zeros): every
    element within the docs/protocol.md §4 bound of its chunk (AVG: divided by W,
    plus one float32 rounding), and the very same bytes on every rank."""
    for key in run["ranks"][0]["float32"]:
        for r in run["ranks"]:
            assert r["float32"][key]["excess"] <= 1.0, (key, r["float32"][key])
        assert len({r["float32"][key]["digest"] for r in run["ranks"]}) == 1, key


def test_half_precision_tensors_travel_as_16_bit_values(run):
    """float16 and bfloat16 tensors go from their own memory onto the 16-bit wire
    (docs/protocol.md §4.2): the twin's result bit for bit, the same on every rank."""
    for dtype in ("float16", "bfloat16"):
        for r in run["ranks"]:
            d = r["direct16"][dtype]
            assert d["dtype"] == f"torch.{dtype}" and d["twin"] and d["avg"], (dtype, d)
            assert d["values16_calls"] == 2  # SUM and AVG
        assert len({r["direct16"][dtype]["digest"] for r in run["ranks"]}) == 1


def test_torchs_compress_hooks_go_through_the_switch_at_16_bits(run):
    """DDP with torch's fp16_compress_hook, and hostlib.torch's fp16/bf16 twins, on a
    switchml group: every bucket's allreduce is a 16-bit call through the switch,
    replicas identical."""
    for r in run["ranks"]:
        for name in ("fp16", "fp16_hostlib", "bf16"):
            h = r["hooks16"][name]
            assert h["identical"] and h["switch_calls"] >= 3, (name, h)
            assert h["values16_calls"] == h["switch_calls"], (name, h)


def test_switchml_values16_puts_float32_on_the_16_bit_wire(run):
    for r in run["ranks"]:
        assert r["float32_values16"] == {"twin": True, "values16_calls": 1}


def test_float64_travels_as_float32(run):
    for r in run["ranks"]:
        s = r["staged"]
        # multiples of 1/64 below 2^24/64: exact through float32
        assert s["float64"]["dtype"] == "torch.float64" and s["float64"]["rel"] == 0.0
        assert s["int32_transposed"]["exact"]


def test_repeated_and_asynchronous_calls(run):
    for r in run["ranks"]:
        assert r["repeated_ok"]
        a = r["async"]
        assert a["ok"] and a["completed"] and a["future_is_tensor"]
        assert a["then"] == 10.0 * W


def test_what_the_switch_cannot_do_goes_to_gloo(run):
    for r in run["ranks"]:
        d = r["delegated"]
        assert d["broadcast"] == [1.0] * 5
        assert d["all_gather"] == [[k] * 3 for k in range(W)]
        assert d["max"] == W - 1 and d["int64"] == sum(range(W)) and d["p2p"] == 42.0
        assert d["scatter"] == [10.0 * r["rank"]] * 2
        assert d["many_all_gathers"]
        assert d["reduce_scatter"] == [W * 2 * r["rank"], W * (2 * r["rank"] + 1)]
        # MAX and int64: gloo; nothing of this went to the switch
        assert d["delegated"] == 2 and d["switch_calls"] == 0
    assert run["ranks"][0]["delegated"]["reduce"] == sum(range(1, W + 1))


def test_a_subgroup_is_a_job_of_its_own(run):
    r0, r1, r2 = run["ranks"]
    assert r1["subgroup"] == {"member": False, "world_ok": True}
    for r in (r0, r2):
        assert r["subgroup"]["ok"] and r["subgroup"]["world_ok"] and r["subgroup"]["size"] == 2
    assert r0["subgroup"]["session_id"] == r2["subgroup"]["session_id"] != r0["session_id"]


def test_ddp_without_a_hook_keeps_identical_replicas(run):
    for r in run["ranks"]:
        assert r["ddp"]["identical"]
        assert r["ddp"]["moved"] > 0  # it trained
        # 4 steps, at least one gradient bucket each: all through the switch
        assert r["ddp"]["switch_calls"] >= 4


def test_the_emulator_aggregated_every_packet(run):
    """The switch's count of aggregated packets is exactly what the ranks sent:
    per call a packet per chunk (plus the exponent window of float calls) from
    each of the W workers; and destroy_process_group released the three jobs (the
    world, the sub-group, the SWITCHML_VALUES16 group)."""
    r0 = run["ranks"][0]
    emu = r0["emulator"]
    assert emu["world_workers"] == W
    packets = r0["stats"]["packets"]
    assert all(r["stats"]["packets"] == packets for r in run["ranks"])
    assert emu["world_aggregated"] == W * packets
    assert emu["sub_aggregated"] == 2 * r0["subgroup"]["packets"]
    after = run["after"]
    assert after["jobs"] == []
    assert after["released"]["explicit"] == 3


def test_torchrun_restarts_the_group_after_a_rank_dies(tmp_path):
    """torchrun's elastic restart, as a user runs it against a long-lived switch:
    ``--max-restarts 1``, rank 1 crashes (``os._exit``) at step 5 of the first
    attempt, torchrun restarts all three ranks, and the new group joins the same
    emulator and trains to the end with identical replicas.

    torchrun's default (static) rendezvous keeps one store for all attempts, so
    the second attempt found the first one's gloo addresses there; without the
    per-attempt part of the store (``attempt_store``) its gloo group connected to
    the dead ranks' ports or waited for them, and never reached the switch."""
    with EmulatorProcess() as emu:
        proc = torchrun(
            tmp_path,
            W,
            "--elastic",
            timeout=300,  # a hang (the ranks' stacks come at 150 s) fails it in bounded time
            max_restarts=1,
            SWITCHML_CONTROL=emu.control,
            SWITCHML_SWITCH=emu.switch,
        )
        after = fetch_stats(emu.control)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    joined = {
        (a, r): json.loads((tmp_path / f"joined-{a}-{r}.json").read_text())
        for a in (0, 1)
        for r in range(W)
    }
    first = {joined[0, r]["session_id"] for r in range(W)}
    second = {joined[1, r]["session_id"] for r in range(W)}
    # each attempt is one SwitchML job of its own on the switch
    assert len(first) == 1 and len(second) == 1 and first != second
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(W)]
    assert all(r["attempt"] == 1 and r["session_id"] in second for r in ranks)
    assert all(r["identical"] and r["moved"] > 0 for r in ranks)
    assert len({r["digest"] for r in ranks}) == 1
    # every step's gradients went through the switch
    assert all(r["switch_calls"] >= r["steps"] for r in ranks)
    # the second attempt released its job; the first one's ranks were killed
    # mid-call and left theirs (freed by the idle timeout)
    assert after["released"]["explicit"] == 1
    assert [j["session_id"] for j in after["jobs"]] == list(first)


def test_a_restarted_attempt_does_not_see_the_last_ones_keys():
    """The store torchrun keeps across restarts, as two attempts see it."""
    import torch.distributed as dist

    from hostlib.torch_backend import attempt_store

    store = dist.HashStore()
    before = attempt_store(store, {"TORCHELASTIC_RESTART_COUNT": "0"})
    before.set("gloo/0", "a dead rank's address")
    again = attempt_store(store, {"TORCHELASTIC_RESTART_COUNT": "1"})
    assert not again.check(["gloo/0"])
    assert attempt_store(store, {}).get("gloo/0") == b"a dead rank's address"  # no torchrun: 0


def test_no_switch_is_one_clear_error(tmp_path):
    """A control plane nobody serves: init_process_group fails with one message
    that names SWITCHML_CONTROL and the address (torchrun stops the other rank
    when the first one fails, so one or both say it)."""
    port = _free_port()
    proc = torchrun(
        tmp_path,
        2,
        "--init-only",
        timeout=120,
        SWITCHML_CONTROL=f"127.0.0.1:{port}",
        SWITCHML_CONNECT_TIMEOUT="2",
    )
    assert proc.returncode != 0, proc.stderr[-4000:]
    # the last line of a rank's traceback, whole. Searched for in all of stderr, not
    # line by line: both ranks write to it at once, and one's piece of a line (torch's
    # "[rankN]: " prefix, an indentation) may land inside the other's
    address = f"127.0.0.1:{port}"
    said = re.findall(
        re.escape("hostlib.errors.SwitchMLError: switchml backend, rank ")
        + r"(\d) of 2: "
        + re.escape(
            f"cannot reach the SwitchML controller at {address} within 2 s "
            f"(is `switchml-emu serve` running?) [SWITCHML_CONTROL={address}]"
        ),
        proc.stderr,
    )
    assert 1 <= len(said) <= 2 and len(set(said)) == len(said), proc.stderr[-4000:]


def test_unset_control_is_a_clear_error():
    """Without SWITCHML_CONTROL the group is refused before anything starts."""
    import torch.distributed as dist

    from hostlib.errors import SwitchMLError
    from hostlib.torch_backend import SwitchMLProcessGroup

    with pytest.raises(SwitchMLError, match="SWITCHML_CONTROL"):
        SwitchMLProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=5), environ={})


def test_importing_hostlib_torch_registers_the_backend():
    import torch.distributed as dist

    import hostlib.torch  # noqa: F401

    assert "switchml" in dist.Backend.backend_list


def test_switchml_run_sets_what_torchrun_would(tmp_path):
    """``switchml run -- python script.py`` (the real console entry point) runs
    a script written for torchrun and the switchml backend unchanged: it sets
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT and SWITCHML_CONTROL/SWITCH for
    its local emulator."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "import hostlib.torch\n"
        "dist.init_process_group('switchml')\n"
        "r, w = dist.get_rank(), dist.get_world_size()\n"
        "assert r == int(os.environ['LOCAL_RANK']) and os.environ['MASTER_ADDR']\n"
        "t = torch.full((1000,), r + 1, dtype=torch.int32)\n"
        "dist.all_reduce(t)\n"
        "net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(20, 3))\n"
        "net(torch.randn(4, 20) * (r + 1)).sum().backward()\n"
        "calls = dist.group.WORLD.switchml_stats()['calls']\n"
        "ok = bool((t == w * (w + 1) // 2).all()) and calls == 2\n"
        "print(f'rank {r} of {w}: ok={ok}', flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    switchml = [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()"]
    p = subprocess.run(
        [*switchml, "run", "--workers", "2", "--", sys.executable, str(script)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert "rank 0 of 2: ok=True" in p.stdout and "rank 1 of 2: ok=True" in p.stdout
