"""p4app-switchML's own C++ client library against ``switchml-emu serve`` (drop-in test).

The client nobody on this project wrote: p4app-switchML (commit b5c74a0), DPDK
backend over af_packet, each worker in its own network namespace, the emulator in
a switch namespace behind a bridge. The tool that builds all of that and checks
every result is ``p4app-client/run.sh`` (see its README); this test runs it
against the emulator of this checkout, lossless, W = 2 and 3, 64 and 256 values
per packet, and asks for every allreduce correct (int32 exact, float32 bit-exact
to the client's quantizer), no drop and no retransmission at the switch, and the
advertised MAC where the client sends its frames (see docs/p4app-switchml.md).
Then the same client against a child switch of a two-level fabric
(docs/fabric.md): its results as correct, its job through the root.

Set ``SWITCHML_P4APP_CLIENT`` to the tool's directory (``.ci/run`` does); the test
skips where it is not set, the tool is missing, or the process may not create
network namespaces (not root, or a container that forbids them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swemu.launch import CHILD_CWD, child_env

TOOL_ENV = "SWITCHML_P4APP_CLIENT"
SIZES = "1,63,64,65,255,256,257,1000,16385,100003,1000003"  # run.sh's default
TYPES = ("int32", "float")


def _tool() -> Path:
    """The tool's directory, or skip with the reason it cannot run here."""
    where = os.environ.get(TOOL_ENV)
    if not where:
        pytest.skip(f"{TOOL_ENV} is not set (the p4app-switchML client tool's directory)")
    tool = Path(where)
    if not (tool / "run.sh").is_file():
        pytest.skip(f"{TOOL_ENV}={where} holds no run.sh")
    if os.geteuid() != 0:
        pytest.skip("the p4app-switchML client test needs root (network namespaces, DPDK)")
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed")
    probe = f"swemu-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"network namespaces are not permitted here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return tool


# (workers, values per packet, bridge MAC, emulator MAC option): the bridge that holds
# the switch's IP gets the MAC; the emulator must advertise it, by default (the
# interface's) or through --advertise-mac
CASES = [
    pytest.param(2, 256, "02:00:5e:be:e0:00", "", id="W2-256"),
    pytest.param(2, 64, "02:00:5e:be:e0:4b", "", id="W2-64-interface-mac"),
    pytest.param(3, 256, "02:00:5e:12:34:56", "--advertise-mac $SWITCH_MAC", id="W3-256-flag-mac"),
    pytest.param(3, 64, "02:00:5e:be:e0:00", "", id="W3-64"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "numel", "mac", "mac_option"), CASES)
def test_p4app_client_allreduce(tmp_path, workers, numel, mac, mac_option):
    tool = _tool()
    emulator = (
        f"{shlex.quote(sys.executable)} -m cli.main serve --host $SW_IP --port $DATA_PORT "
        "--control-host 0.0.0.0 --control-port $CONTROL_PORT --no-gso "
        f'--ready-file "$READY_FILE" {mac_option}'
    )
    logs = tmp_path / "logs"
    cmd = [
        str(tool / "run.sh"),
        "--emulator",
        emulator,
        "--workers",
        str(workers),
        "--numel",
        str(numel),
        "--sizes",
        SIZES,
        "--repeats",
        "1",
        "--time-limit",
        "240",
        "--log-dir",
        str(logs),
    ]
    env = child_env(P4APP_SWITCH_MAC=mac)
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=CHILD_CWD, timeout=600)
    out = run.stdout + run.stderr
    expected = len(SIZES.split(",")) * len(TYPES)
    assert run.returncode == 0, out
    assert f"{expected} passed, 0 failed" in out, out
    assert len(re.findall(r"^OK   type=", out, re.M)) == expected, out
    # the emulator's own counters: every packet aggregated, nothing dropped or resent
    counters = dict(re.findall(r"(\w+)=(\d+)", re.search(r"emulator shutdown: .*", out)[0]))
    for name in (
        "drop_unknown_source",
        "drop_malformed",
        "drop_wrong_size",
        "drop_slot_range",
        "retransmissions",
    ):
        assert counters[name] == "0", (name, out)
    assert int(counters["aggregated"]) == int(counters["pkts_in"]) > 0, out
    # the MAC the clients addressed their frames to is the one it advertised
    ready = json.loads((logs / "emu.ready").read_text())
    assert ready["mac"] == mac


#: The emulator command of the fabric case: in the switch namespace (run.sh's own,
#: so fixed ports are free), a root on 127.0.0.1 (its log in root.log), then the
#: child switch the clients talk to, with run.sh's addresses and the options
#: above; on run.sh's SIGINT both stop (their summaries in the logs) before the
#: command ends.
TWO_LEVELS = """\
py=$1
"$py" -m cli.main serve --host 127.0.0.1 --port 48865 --control-port 50100 --log-level info \\
    --ready-file root.ready >root.log 2>&1 &
root=$!
while [ ! -e root.ready ]; do kill -0 $root 2>/dev/null || exit 1; sleep 0.1; done
"$py" -m cli.main serve --host "$SW_IP" --port "$DATA_PORT" --control-host 0.0.0.0 \\
    --control-port "$CONTROL_PORT" --no-gso --identify-by ip --ready-file "$READY_FILE" \\
    --parent 127.0.0.1:50100 --always-up &
child=$!
trap 'kill -INT $child $root 2>/dev/null' INT TERM
wait $child
while kill -0 $child 2>/dev/null || kill -0 $root 2>/dev/null; do wait; done
"""


def _counters(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.slow
def test_p4app_client_through_a_child_switch(tmp_path):
    """The same client, W = 3, against a child switch of a two-level fabric
    (``serve --parent ROOT --always-up``, so that the job crosses both levels
    although all of its workers are at the child): every allreduce correct; the
    child aggregated every packet of its workers and sent each slot's partial
    aggregate up; the root aggregated exactly those and multicast each result
    back (its summary in root.log)."""
    tool = _tool()
    script = tmp_path / "two_levels.sh"
    script.write_text(TWO_LEVELS)
    logs = tmp_path / "logs"
    cmd = [
        str(tool / "run.sh"),
        "--emulator",
        f'bash {shlex.quote(str(script))} {shlex.quote(sys.executable)} "$READY_FILE"',
        *("--workers", "3", "--numel", "256", "--sizes", SIZES, "--repeats", "1"),
        *("--time-limit", "240", "--log-dir", str(logs)),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=600)
    out = run.stdout + run.stderr
    expected = len(SIZES.split(",")) * len(TYPES)
    assert run.returncode == 0, out + (logs / "root.log").read_text()[-3000:]
    assert f"{expected} passed, 0 failed" in out, out
    child = _counters(re.search(r"emulator shutdown: .*", out)[0])
    for name in ("drop_unknown_source", "drop_malformed", "drop_wrong_size", "drop_slot_range"):
        assert child[name] == 0, (name, out)
    assert child["aggregated"] == child["pkts_in"] > 0, out
    # every slot's sum went up once (and maybe again, resent) and its result came back
    slots = child["aggregated"] // 3
    assert child["up_sent"] == child["up_results"] == slots, out
    root_log = (logs / "root.log").read_text()
    root = _counters(re.search(r"shutdown: .*", root_log)[0])
    assert root["aggregated"] == root["multicast"] == slots, root_log[-3000:]
    assert root["pkts_in"] == slots + child["up_retransmissions"], root_log[-3000:]
    assert "fabric session" in root_log  # the root planned the job's tree
