#!/usr/bin/env bash
# toolchain.sh -- build, outside the repository, the two tools that run p4/switchml.p4 on
# Intel's Tofino model: bf-p4c (p4c's open-source Tofino back end) and open-p4studio's
# Tofino-1 model (tofino-model) with bf_switchd (BF Runtime and its gRPC server).
#
# usage: p4/model/toolchain.sh [OPTIONS] bf-p4c|model      build (or continue building)
#        p4/model/toolchain.sh [OPTIONS] status [bf-p4c|model]   print the STATUS files
#
#   --background    run detached (setsid, nohup) at idle priority (chrt --idle 0, nice 19);
#                   the output goes to DIR/build.log, the state to DIR/STATUS
#   --dir DIR       where the tool is built (default $SWITCHML_TOOLCHAIN_DIR/TOOL, and
#                   that defaults to ~/.cache/switchml-emu: .../bf-p4c, .../open-p4studio)
#   --src DIR       an already present source tree of p4c (bf-p4c) or open-p4studio (model)
#                   at the pinned revision, instead of cloning one
#   --jobs N        parallel compile jobs (default min(nproc, available GiB / 3), at least 1)
#   --steps         list the steps of the tool and which are done
#
# Sources are cloned at pinned revisions (below) from
#   $SWITCHML_GIT_URL, a template with {owner} and {name}
#   (default https://github.com/{owner}/{name}.git); on a machine with local mirrors point
#   it there, e.g. SWITCHML_GIT_URL='/srv/mirror/{owner}+{name}/repo'.
# Each step leaves a stamp in DIR/stamps; running the same command again continues with the
# first step without a stamp (the compile step itself is incremental: ninja). Remove a stamp
# to redo its step. The patches this script applies are listed in p4/README.md ("Running on
# the Tofino model"), each with the reason.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
here=$(dirname "$self")
root=${SWITCHML_TOOLCHAIN_DIR:-$HOME/.cache/switchml-emu}
git_url=${SWITCHML_GIT_URL:-https://github.com/{owner}/{name}.git}

# Pinned revisions.
P4C_REPO=p4lang/p4c
P4C_REV=34b86e9bacb932c799aaf1b83495ce1e386ea047        # p4c 1.2.5.16 (Tofino back end 9.13.4)
ABSEIL_REV=dd4c89bd657f1e247ce5111a5c89ffe6ccfd0c92     # 20240722.1, what p4c fetches
PROTOBUF_REV=2fc6cf3fb16b431874a8428b66efe0fda8f26e01   # v25.3
BDWGC_REV=7f1503dbfe254e77678666a0e09b735add064b57      # v8.2.6
Z3_REV=54d30f26f72ce62f5dcb5a5258f632f84858714f         # z3-4.13.3
P4RUNTIME_REV=ec4eb5ef70dbcbcbf2f8357a4b2b8c2f218845a5
SPDLOG_REV=v1.8.3
STUDIO_REPO=p4lang/open-p4studio
STUDIO_REV=1f97778f9ad5c8165bfce552fffe27c69887756b

background=0 dir= src= jobs= list_steps=0
while [ $# -gt 0 ]; do
  case $1 in
    --background) background=1; shift ;;
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    --src) src=$(readlink -f "${2:?--src needs a directory}"); shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --steps) list_steps=1; shift ;;
    -h|--help) sed -n '2,28p' "$self" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "toolchain.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
tool=${1:-}
case $tool in
  bf-p4c) dir=${dir:-$root/bf-p4c} ;;
  model) dir=${dir:-$root/open-p4studio} ;;
  status)
    for t in ${2:-bf-p4c open-p4studio}; do
      [ "$t" = model ] && t=open-p4studio
      f=$root/$t/STATUS
      if [ -f "$f" ]; then echo "== $f"; cat "$f"; else echo "== $f: none"; fi
    done
    exit 0 ;;
  *) echo "toolchain.sh: say which tool: bf-p4c, model or status (see --help)" >&2; exit 2 ;;
esac
if [ -n "$jobs" ] && ! [[ $jobs =~ ^[1-9][0-9]*$ ]]; then
  echo "toolchain.sh: --jobs wants a positive number, not '$jobs'" >&2; exit 2
fi
mkdir -p "$dir/stamps"
dir=$(readlink -f "$dir")

# ---------------------------------------------------------------- background ---------------
if [ "$background" = 1 ]; then
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    echo "toolchain.sh: a build of $tool is already running in $dir (pid $(cat "$dir/pid"))" >&2
    exit 1
  fi
  # Run a copy, so that editing this file does not change a running build under bash's feet.
  mkdir -p "$dir/.run"
  cp "$self" "$dir/.run/toolchain.sh"
  args=(--dir "$dir")
  [ -n "$src" ] && args+=(--src "$src")
  [ -n "$jobs" ] && args+=(--jobs "$jobs")
  echo "== $(date -Is) start $tool (background, pid below)" >>"$dir/build.log"
  SWITCHML_TOOLCHAIN_BG=1 setsid nohup chrt --idle 0 nice -n 19 \
    /usr/bin/time -v -o "$dir/time.txt" bash "$dir/.run/toolchain.sh" "${args[@]}" "$tool" \
    >>"$dir/build.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  echo "toolchain.sh: building $tool in the background (pid $!)"
  echo "  log:    $dir/build.log"
  echo "  status: $dir/STATUS   (p4/model/toolchain.sh status)"
  exit 0
fi

# ---------------------------------------------------------------- status and helpers -------
started=$(date -Is)
start_s=$(date +%s)
step_now=
peak_kib=0

status() {  # status STATE [NOTE]
  local tmp=$dir/STATUS.tmp
  {
    echo "tool: $tool"
    echo "dir: $dir"
    echo "log: $dir/build.log"
    echo "started: $started"
    echo "pid: $$"
    echo "jobs: $jobs"
    echo "state: $1"
    echo "step: $step_now"
    echo "done steps: $(ls "$dir/stamps" 2>/dev/null | tr '\n' ' ')"
    [ -n "${2:-}" ] && echo "note: $2"
    if [ "$1" != running ]; then
      echo "finished: $(date -Is)"
      echo "wall time: $(( $(date +%s) - start_s )) s"
      echo "disk use: $(du -sh "$dir" 2>/dev/null | cut -f1)"
      echo "peak memory (sampled, all processes of the build): $((peak_kib / 1024)) MiB"
      echo "(largest single process: see $dir/time.txt, Maximum resident set size)"
    fi
  } >"$tmp"
  mv "$tmp" "$dir/STATUS"
}

sample_memory() {  # total RSS of this build's session every 20 s; peak in DIR/peak_kib
  local sid peak=0 now
  sid=$(ps -o sid= -p $$ | tr -d ' ')
  while kill -0 $$ 2>/dev/null; do
    now=$(ps -o rss= -s "$sid" 2>/dev/null | awk '{s += $1} END {print s + 0}')
    if [ "$now" -gt "$peak" ]; then peak=$now; echo "$peak" >"$dir/peak_kib"; fi
    sleep 20
  done
}

finish() {
  local rc=$?
  [ -f "$dir/peak_kib" ] && peak_kib=$(cat "$dir/peak_kib")
  if [ "$rc" = 0 ]; then
    status done
  else
    status failed "exit status $rc in step '$step_now'; see $dir/build.log. Run the same command again to continue."
  fi
  rm -f "$dir/pid"
}

default_jobs() {
  local avail_gib n
  avail_gib=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
  n=$(( avail_gib / 3 ))
  [ "$n" -gt "$(nproc)" ] && n=$(nproc)
  [ "$n" -lt 1 ] && n=1
  echo "$n"
}
jobs=${jobs:-$(default_jobs)}

repo_url() {  # repo_url owner/name
  local u=${git_url//\{owner\}/${1%%/*}}
  echo "${u//\{name\}/${1#*/}}"
}

checkout() {  # checkout owner/name REV DEST: a clone of the repository at REV in DEST
  local repo=$1 rev=$2 dest=$3
  if [ -d "$dest/.git" ] || [ -f "$dest/.git" ]; then
    local want have
    want=$(git -C "$dest" rev-parse --verify -q "$rev^{commit}" || true)
    have=$(git -C "$dest" rev-parse HEAD)
    if [ -n "$want" ] && [ "$want" = "$have" ]; then return 0; fi
    echo "toolchain.sh: $dest is at $have, not $repo@$rev: remove it or point --src elsewhere" >&2
    return 1
  fi
  rm -rf "$dest.part"
  git clone --no-checkout "$(repo_url "$repo")" "$dest.part"
  git -C "$dest.part" -c advice.detachedHead=false checkout "$rev"
  mv "$dest.part" "$dest"
}

run_step() {  # run_step NAME FUNCTION: run FUNCTION unless NAME is stamped
  step_now=$1
  if [ -f "$dir/stamps/$1" ]; then echo "== step $1: done before"; return 0; fi
  echo "== $(date -Is) step $1"
  status running
  "$2"
  date -Is >"$dir/stamps/$1"
}

need_debs() {  # need_debs PKG...: install the Debian packages that are missing
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} = 0 ] && return 0
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  else
    echo "toolchain.sh: missing Debian packages (install them as root): ${missing[*]}" >&2
    return 1
  fi
}

# ---------------------------------------------------------------- bf-p4c -------------------
P4C=
bfp4c_steps=(debs sources patch venv configure compile)

bfp4c_debs() {
  need_debs git cmake ninja-build g++ bison flex libfl-dev libboost-dev \
    libboost-iostreams-dev libboost-graph-dev rapidjson-dev pkg-config python3-venv patch
}

bfp4c_sources() {
  if [ -z "$src" ]; then checkout "$P4C_REPO" "$P4C_REV" "$dir/src/p4c"; fi
  mkdir -p "$dir/src/deps"
  checkout abseil/abseil-cpp "$ABSEIL_REV" "$dir/src/deps/abseil"
  checkout protocolbuffers/protobuf "$PROTOBUF_REV" "$dir/src/deps/protobuf"
  checkout ivmai/bdwgc "$BDWGC_REV" "$dir/src/deps/bdwgc"
  checkout Z3Prover/z3 "$Z3_REV" "$dir/src/deps/z3"
  checkout p4lang/p4runtime "$P4RUNTIME_REV" "$dir/src/deps/p4runtime"
  # bf-p4c's cmake/spdlog.cmake takes spdlog from backends/tofino/third_party/spdlog.
  checkout gabime/spdlog "$SPDLOG_REV" "$P4C/backends/tofino/third_party/spdlog"
}

bfp4c_patch() {
  # 1. p4c's own cmake/z3.patch (Z3's uninstall target renamed; malloc_usable_size with
  #    libgc): FetchContent applies it only when it downloads Z3 itself.
  if git -C "$dir/src/deps/z3" apply --check "$P4C/cmake/z3.patch" 2>/dev/null; then
    git -C "$dir/src/deps/z3" apply "$P4C/cmake/z3.patch"
  else
    git -C "$dir/src/deps/z3" apply -R --check "$P4C/cmake/z3.patch"   # applied before
  fi
  # 2. p4c #5753: MatcherAllocator::bind_use kept only the scratch-register slices, so on
  #    Tofino 1 every parser select lost its match registers (p4c #5063). Keep the others.
  local f=$P4C/backends/tofino/bf-p4c/parde/allocate_parser_match_register.cpp
  if ! grep -q 'switchml-emu: keep non-scratch' "$f"; then
    grep -q 'if (!is_scratch_register(reg_slice.first)) continue;' "$f"
    sed -i 's|if (!is_scratch_register(reg_slice.first)) continue;|if (!is_scratch_register(reg_slice.first)) {  // switchml-emu: keep non-scratch (p4c #5753)\n                    serializable_reg_slices.emplace_back(MatchRegister(reg_slice.first), reg_slice.second);\n                    continue;\n                }|' "$f"
  fi
  # 3. p4c #5750: find_file() returns a Path, the bf-p4c driver later calls str methods on
  #    the command: store commands as str.
  f=$P4C/tools/driver/p4c_src/driver.py
  if ! grep -q 'append(os.fspath(cmd))' "$f"; then
    grep -q 'self._commands\[cmd_name\].append(cmd)$' "$f"
    sed -i 's|self._commands\[cmd_name\].append(cmd)$|self._commands[cmd_name].append(os.fspath(cmd))|' "$f"
  fi
}

bfp4c_venv() {
  # The Python the build (pyinstaller for p4c-build-logs) and the bf-p4c driver need.
  /usr/bin/python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install --quiet jsl jsonschema pyyaml pyinstaller
}

bfp4c_configure() {
  PATH=$dir/venv/bin:$PATH cmake -S "$P4C" -B "$dir/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON \
    -DENABLE_TOFINO=ON -DENABLE_CONTROL_PLANE=ON -DENABLE_GC=ON -DP4C_DRIVER_NAME=bf-p4c \
    -DENABLE_BMV2=OFF -DENABLE_EBPF=OFF -DENABLE_UBPF=OFF -DENABLE_DPDK=OFF -DENABLE_P4TC=OFF \
    -DENABLE_P4FMT=OFF -DENABLE_P4TEST=OFF -DENABLE_P4C_GRAPHS=OFF -DENABLE_TEST_TOOLS=OFF \
    -DENABLE_GTESTS=OFF -DENABLE_DOCS=OFF -DENABLE_LTO=OFF -DENABLE_WERROR=OFF \
    -DENABLE_CCACHE=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_ABSEIL="$dir/src/deps/abseil" \
    -DFETCHCONTENT_SOURCE_DIR_PROTOBUF="$dir/src/deps/protobuf" \
    -DFETCHCONTENT_SOURCE_DIR_BDWGC="$dir/src/deps/bdwgc" \
    -DFETCHCONTENT_SOURCE_DIR_Z3="$dir/src/deps/z3" \
    -DFETCHCONTENT_SOURCE_DIR_P4RUNTIME="$dir/src/deps/p4runtime"
}

bfp4c_compile() {
  PATH=$dir/venv/bin:$PATH cmake --build "$dir/build" -j "$jobs"
  ln -sfn "$dir/build/bf-p4c" "$dir/bf-p4c"
  echo "bf-p4c: $dir/build/bf-p4c (put $dir/venv/bin on PATH; p4/build.sh --compiler $dir/build/bf-p4c)"
}

# ---------------------------------------------------------------- model --------------------
model_steps=()

# ---------------------------------------------------------------- main ---------------------
case $tool in
  bf-p4c) P4C=${src:-$dir/src/p4c}; steps=("${bfp4c_steps[@]}"); prefix=bfp4c ;;
  model) STUDIO=${src:-$dir/src/open-p4studio}; steps=("${model_steps[@]}"); prefix=model ;;
esac
if [ "$list_steps" = 1 ]; then
  for s in "${steps[@]}"; do
    if [ -f "$dir/stamps/$s" ]; then echo "$s: done $(cat "$dir/stamps/$s")"; else echo "$s: to do"; fi
  done
  exit 0
fi
echo "$$" >"$dir/pid"
rm -f "$dir/peak_kib"
trap finish EXIT
sample_memory &
echo "== $(date -Is) $tool in $dir, $jobs job(s), $(nproc) cores"
for s in "${steps[@]}"; do
  run_step "$s" "${prefix}_$s"
done
step_now=
