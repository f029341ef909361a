#!/usr/bin/env bash
# Run p4/switchml.p4 on Intel's Tofino 1 model with the project's controller.
#
# NOT RUN YET: written before a model build finished (p4/README.md, "Running on the Tofino
# model"). What it does, in order:
#   1. a network namespace NETNS holding the model's ports, and one NETNS-w<i> per worker:
#      a veth pair veth<2i> (the model's end, in NETNS, device port 4i) <-> veth<2i+1> (in
#      NETNS-w<i>, 10.0.0.<i+1>/24; the switch is 10.0.0.254); ports.json maps the device
#      ports to the veths for tofino-model (-f). A management bridge in NETNS
#      (192.168.99.254/24) with one veth to each worker namespace (192.168.99.<i+1>) carries
#      the control plane;
#   2. tofino-model (chip type 2, Tofino 1) in NETNS, logs in OUT/model.log;
#   3. bf_switchd in NETNS with a conf file that loads OUT/switchml (p4/build.sh output:
#      bfrt.json, pipe/context.json, pipe/tofino.bin); its BF Runtime gRPC server on
#      127.0.0.1:50052 of NETNS;
#   4. p4/controller/switchml_ctl.py in NETNS programming the switch over BF Runtime and
#      serving docs/protocol.md §5's gRPC API on CONTROL_PORT (workers reach it at
#      192.168.99.254:CONTROL_PORT).
#
# usage: p4/model/run.sh [--sde-install DIR] [--program DIR] [--out DIR] [--workers N]
#                        [--netns NAME] [--control-port PORT]
#   --sde-install DIR  build-model.sh's install tree (default
#                      ~/.cache/switchml-emu/open-p4studio/install)
#   --program DIR      p4/build.sh's output for switchml (default p4/build/switchml)
#   --out DIR          logs, ports.json, switchml.conf (default p4/model/run)
#   --workers N        worker ports (default 3): device ports 0, 4, 8, ... (one per 25G
#                      lane group of the model's front panel)
# Stops everything it started on exit (Ctrl-C).

set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

sde_install=${SDE_INSTALL:-$HOME/.cache/switchml-emu/open-p4studio/install}
program=$repo/p4/build/switchml
out=$here/run
workers=3
netns=swml-model
control_port=50099
switch_ip=10.0.0.254
while (($#)); do
  case $1 in
    --sde-install) sde_install=$2; shift 2 ;;
    --program) program=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --netns) netns=$2; shift 2 ;;
    --control-port) control_port=$2; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

die() { echo "run.sh: $*" >&2; exit 1; }
[[ -x $sde_install/bin/tofino-model ]] || die "no $sde_install/bin/tofino-model (p4/model/build-model.sh)"
[[ -x $sde_install/bin/bf_switchd ]] || die "no $sde_install/bin/bf_switchd (p4/model/build-model.sh)"
for f in bfrt.json pipe/context.json pipe/tofino.bin; do
  [[ -s $program/$f ]] || die "no $program/$f (p4/build.sh with bf-p4c)"
done
((workers >= 1 && workers <= 16)) || die "--workers must be 1..16"
mkdir -p "$out"
export LD_LIBRARY_PATH=$sde_install/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ((i = 0; i < workers; i++)); do ip netns del "$netns-w$i" 2>/dev/null || true; done
  ip netns del "$netns" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

# 1. the namespace and the model's ports
ip netns add "$netns"
ip -n "$netns" link set lo up
ip -n "$netns" link add br-mgmt type bridge
ip -n "$netns" addr add 192.168.99.254/24 dev br-mgmt
ip -n "$netns" link set br-mgmt up
ports_json=$out/ports.json
{
  echo '{"PortToVeth": ['
  for ((i = 0; i < workers; i++)); do
    w=$netns-w$i
    ip netns add "$w"
    ip -n "$w" link set lo up
    ip -n "$netns" link add "veth$((2 * i))" type veth peer name "veth$((2 * i + 1))" netns "$w"
    ip -n "$netns" link set "veth$((2 * i))" mtu 9500 up
    ip netns exec "$netns" sysctl -qw "net.ipv6.conf.veth$((2 * i)).disable_ipv6=1"
    ip -n "$w" link set "veth$((2 * i + 1))" mtu 9500 up
    ip -n "$w" addr add "10.0.0.$((i + 1))/24" dev "veth$((2 * i + 1))"
    ip -n "$netns" link add "mgmt$i" type veth peer name mgmt netns "$w"
    ip -n "$netns" link set "mgmt$i" master br-mgmt up
    ip -n "$w" addr add "192.168.99.$((i + 1))/24" dev mgmt
    ip -n "$w" link set mgmt up
    sep=,
    ((i < workers - 1)) || sep=
    echo "  {\"device_port\": $((4 * i)), \"veth1\": $((2 * i)), \"veth2\": $((2 * i + 1))}$sep"
  done
  echo ']}'
} >"$ports_json"

# bf_switchd's conf file: one Tofino 1 device, one program on all four pipes; no platform
# agent (agent0: bf-platforms' libpltfm_mgr.so, built only for an ASIC with its BSP).
conf=$out/switchml.conf
cat >"$conf" <<EOF
{
  "chip_list": [{"id": "asic-0", "chip_family": "Tofino", "instance": 0,
                 "pcie_sysfs_prefix": "/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0",
                 "pcie_domain": 0, "pcie_bus": 5, "pcie_fn": 0, "pcie_dev": 0,
                 "pcie_int_mode": 1, "sds_fw_path": "share/tofino_sds_fw/avago/firmware"}],
  "instance": 0,
  "p4_devices": [{
    "device-id": 0,
    "p4_programs": [{
      "program-name": "switchml",
      "bfrt-config": "$program/bfrt.json",
      "p4_pipelines": [{
        "p4_pipeline_name": "pipe",
        "context": "$program/pipe/context.json",
        "config": "$program/pipe/tofino.bin",
        "pipe_scope": [0, 1, 2, 3],
        "path": "$program"
      }]
    }]
  }]
}
EOF

# 2. the model
ip netns exec "$netns" "$sde_install/bin/tofino-model" --chip-type 2 -f "$ports_json" \
  --install-dir "$sde_install" --log-dir "$out" >"$out/model.log" 2>&1 &
pids+=($!)
sleep 2

# 3. the driver, with BF Runtime's gRPC server
ip netns exec "$netns" env SDE_INSTALL="$sde_install" "$sde_install/bin/bf_switchd" \
  --install-dir "$sde_install" --conf-file "$conf" --background \
  >"$out/switchd.log" 2>&1 &
pids+=($!)
for _ in $(seq 120); do
  ip netns exec "$netns" bash -c 'exec 3<>/dev/tcp/127.0.0.1/50052' 2>/dev/null && break
  sleep 1
done

# 4. the controller: worker i at 10.0.0.(i+1) on device port 4i
worker_args=()
for ((i = 0; i < workers; i++)); do
  mac=$(ip -n "$netns-w$i" -br link show "veth$((2 * i + 1))" | awk '{print $3}')
  worker_args+=(--worker "10.0.0.$((i + 1))=$((4 * i))/$mac")
done
# The SDE's BF Runtime Python client (bfrt_grpc) from the install tree.
sde_py=$(ls -d "$sde_install"/lib/python3*/site-packages 2>/dev/null | head -1)
[[ -d $sde_py/tofino/bfrt_grpc ]] || die "no bfrt_grpc under $sde_install/lib/python3*/site-packages/tofino"
ip netns exec "$netns" env PYTHONPATH="$repo:$sde_py:$sde_py/tofino:$sde_py/tofino/bfrt_grpc" \
  "${PYTHON:-python3}" "$repo/p4/controller/switchml_ctl.py" \
  --bfrt-addr 127.0.0.1:50052 --switch-ip "$switch_ip" --control-port "$control_port" \
  --ready-file "$out/ready.json" "${worker_args[@]}" >"$out/controller.log" 2>&1 &
pids+=($!)

echo "model: $out/model.log, switchd: $out/switchd.log, controller: $out/controller.log"
echo "worker i: ip netns exec $netns-w<i> switchml run --control 192.168.99.254:$control_port ..."
wait -n "${pids[@]}"
die "a process ended; see the logs in $out"
