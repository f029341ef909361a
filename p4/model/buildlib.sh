# shellcheck shell=bash
# Shared helpers of build-bf-p4c.sh, build-p4testgen.sh and build-model.sh (sourced, not run).
#
# A build lives in one persistent directory outside the repository ($BUILD_DIR):
#   src/...       the sources, cloned at pinned revisions
#   stamps/STEP   one empty file per finished step; a re-run skips stamped steps
#   build.log     everything the steps print (background runs)
#   STATUS        the current step, start time; at the end the wall time, disk use, peak memory
#   time.txt      /usr/bin/time -v of the whole run (peak memory = its maximum resident set)
#
# Sources: each repository is cloned from GIT_BASE, a template where {owner} and {name} are
# replaced (default https://github.com/{owner}/{name}); a local mirror works the same way,
# e.g. GIT_BASE=/srv/mirror/{owner}+{name}/repo. One repository can be overridden with
# SRC_<NAME>=DIR (a git repository, bare or not, cloned from; or a plain source tree, copied).

set -euo pipefail

: "${GIT_BASE:=https://github.com/{owner}/{name}}"

die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

log() { echo "[$(date '+%F %T')] $*"; }

# jobs_for_memory GIB_PER_JOB: min(nproc, MemAvailable / GIB_PER_JOB), at least 1.
jobs_for_memory() {
  local per=$1 cpus avail_kib by_mem
  cpus=$(nproc)
  avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
  by_mem=$((avail_kib / (per * 1024 * 1024)))
  ((by_mem < 1)) && by_mem=1
  ((by_mem < cpus)) && echo "$by_mem" || echo "$cpus"
}

status() {
  # status KEY VALUE: set one line of $BUILD_DIR/STATUS (KEY: VALUE), keep the others.
  local key=$1 value=$2 file=$BUILD_DIR/STATUS
  touch "$file"
  grep -v "^$key: " "$file" >"$file.tmp" || true
  echo "$key: $value" >>"$file.tmp"
  mv "$file.tmp" "$file"
}

# step NAME COMMAND...: run COMMAND unless stamps/NAME exists; stamp it on success.
step() {
  local name=$1
  shift
  if [[ -e $BUILD_DIR/stamps/$name ]]; then
    log "step $name: done before, skipped"
    return 0
  fi
  status step "$name (since $(date '+%F %T'))"
  log "step $name: start"
  "$@"
  mkdir -p "$BUILD_DIR/stamps"
  touch "$BUILD_DIR/stamps/$name"
  log "step $name: done"
}

# fetch_src NAME OWNER/REPO REV DEST: DEST checked out at REV (cloned once).
fetch_src() {
  local name=$1 slug=$2 rev=$3 dest=$4
  local override_var="SRC_${name^^}" origin
  override_var=${override_var//-/_}
  local override=${!override_var:-}
  if [[ -n $override && -d $override && ! -e $override/.git && ! -e $override/HEAD ]]; then
    log "$name: copying the source tree $override"
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    cp -a "$override" "$dest"
    return 0
  fi
  if [[ -n $override ]]; then
    origin=$override
  else
    origin=${GIT_BASE//\{owner\}/${slug%%/*}}
    origin=${origin//\{name\}/${slug#*/}}
  fi
  log "$name: $origin at $rev"
  if [[ ! -e $dest/.git ]]; then
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    git clone -q --no-checkout "$origin" "$dest"
  fi
  if ! git -C "$dest" -c advice.detachedHead=false checkout -q -f "$rev" 2>/dev/null; then
    checkout_without_missing "$dest" "$rev"
  fi
}

# checkout_without_missing DIR REV: check REV out leaving out the files whose contents the
# repository lacks (a partial mirror keeps large binaries out), by a sparse checkout.
checkout_without_missing() {
  local dest=$1 rev=$2 missing
  missing=$(git -C "$dest" ls-tree -r "$rev" | awk '$2 == "blob" {print $3}' |
    git -C "$dest" cat-file --batch-check='%(objectname) %(objecttype)' 2>/dev/null |
    awk '$2 == "missing" {print $1}' || true)
  [[ -n $missing ]] || die "cannot check out $rev in $dest"
  local paths
  paths=$(git -C "$dest" ls-tree -r "$rev" | awk '$2 == "blob"' |
    grep -F -f <(echo "$missing") | cut -f2-)
  log "$(basename "$dest"): $(wc -l <<<"$paths") files absent from the mirror left out: $(head -3 <<<"$paths" | tr '\n' ' ')"
  local patterns=('/*') path
  while IFS= read -r path; do patterns+=("!/$path"); done <<<"$paths"
  git -C "$dest" sparse-checkout set --no-cone "${patterns[@]}"
  git -C "$dest" -c advice.detachedHead=false checkout -q -f "$rev"
}

# apply_patch DIR NAME: apply the unified diff on stdin to DIR once (stamp NAME); a
# source that has the change already (a later upstream revision) is left as it is.
apply_patch() {
  local dir=$1 name=$2 diff
  diff=$(cat)
  if [[ -e $BUILD_DIR/stamps/patch-$name ]]; then
    return 0
  fi
  if patch -d "$dir" -p1 --reverse --dry-run -s -f <<<"$diff" >/dev/null 2>&1; then
    log "patch $name: the sources have it already"
  elif patch -d "$dir" -p1 --forward --dry-run -s <<<"$diff" >/dev/null; then
    patch -d "$dir" -p1 --forward -s <<<"$diff"
    log "patch $name applied"
  else
    die "patch $name does not apply to $dir"
  fi
  mkdir -p "$BUILD_DIR/stamps"
  touch "$BUILD_DIR/stamps/patch-$name"
}

# finish: the wall time, disk use and (with time.txt) peak memory into STATUS.
finish() {
  local started=$1
  status step "done"
  status finished "$(date '+%F %T')"
  status wall_time "$(($(date +%s) - started)) s (this run's steps)"
  status disk "$(du -sh "$BUILD_DIR" | cut -f1)"
}

# print_status: the --status option of both scripts (STATUS, make's last progress
# figure, the log's last lines).
print_status() {
  local progress
  cat "${BUILD_DIR}/STATUS" 2>/dev/null || echo "no build in $BUILD_DIR"
  progress=$(grep -aoE '^\[ *[0-9]+%\]' "$BUILD_DIR/build.log" 2>/dev/null | tail -n 1 || true)
  echo "compile progress (make's last figure): ${progress:-none yet}"
  tail -n 5 "$BUILD_DIR/build.log" 2>/dev/null || true
}

# begin_build SCRIPT BACKGROUND ARGS...: make $BUILD_DIR absolute (and exported); with
# BACKGROUND 1, re-run SCRIPT with ARGS minus --background detached and exit.
begin_build() {
  local script=$1 background=$2 a rest=()
  shift 2
  BUILD_DIR=$(mkdir -p "$BUILD_DIR" && cd "$BUILD_DIR" && pwd)
  export BUILD_DIR
  if ((background)); then
    for a in "$@"; do [[ $a == --background ]] || rest+=("$a"); done
    run_background "$script" "${rest[@]}" --dir "$BUILD_DIR"
    exit 0
  fi
}

# run_background SCRIPT ARGS...: re-run SCRIPT detached (setsid nohup) at idle priority,
# appending to $BUILD_DIR/build.log; /usr/bin/time -v measures it (time.txt) and its peak
# resident set and exit status go into STATUS when it ends.
run_background() {
  local script=$1
  shift
  mkdir -p "$BUILD_DIR"
  if [[ -e $BUILD_DIR/pid ]] && kill -0 "$(cat "$BUILD_DIR/pid")" 2>/dev/null; then
    die "a build is running in $BUILD_DIR (pid $(cat "$BUILD_DIR/pid"))"
  fi
  local prio=(nice -n 19)
  if chrt --idle 0 true 2>/dev/null; then prio=(chrt --idle 0 nice -n 19); fi
  [[ -x /usr/bin/time ]] || die "/usr/bin/time is needed for --background (Debian package time)"
  status started "$(date '+%F %T')"
  grep -q '^first_started: ' "$BUILD_DIR/STATUS" || status first_started "$(date '+%F %T')"
  status log "$BUILD_DIR/build.log"
  status exit "running"
  # The last run's figures describe that run only (a killed run leaves none).
  grep -vE '^(peak_memory|wall_clock): ' "$BUILD_DIR/STATUS" >"$BUILD_DIR/STATUS.tmp" || true
  mv "$BUILD_DIR/STATUS.tmp" "$BUILD_DIR/STATUS"
  # shellcheck disable=SC2016
  setsid nohup "${prio[@]}" bash -c '
    dir=$1; shift
    /usr/bin/time -v -o "$dir/time.txt" "$@"; rc=$?
    peak=$(awk -F": " "/Maximum resident/ {print \$2}" "$dir/time.txt")
    wall=$(awk -F": " "/Elapsed .wall clock/ {print \$2}" "$dir/time.txt")
    grep -vE "^(exit|peak_memory|wall_clock): " "$dir/STATUS" >"$dir/STATUS.tmp"
    { echo "exit: $rc"; echo "peak_memory: ${peak} KiB (largest process, this run)";
      echo "wall_clock: $wall (this run)"; } >>"$dir/STATUS.tmp"
    mv "$dir/STATUS.tmp" "$dir/STATUS"
    exit $rc
  ' _ "$BUILD_DIR" bash "$script" "$@" >>"$BUILD_DIR/build.log" 2>&1 </dev/null &
  echo $! >"$BUILD_DIR/pid"
  echo "started in the background (pid $!): log $BUILD_DIR/build.log, status $BUILD_DIR/STATUS"
}

# --- p4c: the sources, patches, Python venv and CMake options that build-bf-p4c.sh and
# build-p4testgen.sh share (both build p4c with its Tofino back end).

# Pinned revisions: p4c and the dependency revisions its CMake files name. P4C_REV may be
# set to a later p4c (one with #5753 and #5750 upstream); its dependency pins may differ.
P4C_REV=${P4C_REV:-34b86e9bacb932c799aaf1b83495ce1e386ea047}
ABSEIL_REV=20240722.1
PROTOBUF_REV=v25.3
Z3_REV=z3-4.13.3
BDWGC_REV=7f1503dbfe254e77678666a0e09b735add064b57 # 8.2.6
P4RUNTIME_REV=ec4eb5ef70dbcbcbf2f8357a4b2b8c2f218845a5
SPDLOG_REV=v1.8.3
P4C_PATCHES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/patches

# p4c_get_sources: p4c and its dependencies into $BUILD_DIR/src (a fresh checkout drops the
# patch stamps, so the patches are applied again).
p4c_get_sources() {
  local src=$BUILD_DIR/src
  rm -f "$BUILD_DIR"/stamps/patch-*
  fetch_src p4c p4lang/p4c "$P4C_REV" "$src/p4c"
  fetch_src abseil-cpp abseil/abseil-cpp "$ABSEIL_REV" "$src/abseil-cpp"
  fetch_src protobuf protocolbuffers/protobuf "$PROTOBUF_REV" "$src/protobuf"
  fetch_src z3 Z3Prover/z3 "$Z3_REV" "$src/z3"
  fetch_src bdwgc ivmai/bdwgc "$BDWGC_REV" "$src/bdwgc"
  fetch_src p4runtime p4lang/p4runtime "$P4RUNTIME_REV" "$src/p4runtime"
  # The Tofino back end takes spdlog from third_party/ when it is there.
  fetch_src spdlog gabime/spdlog "$SPDLOG_REV" "$src/p4c/backends/tofino/third_party/spdlog"
}

# p4c_patch_sources: p4c's own patch of Z3 (its uninstall target clashes with p4c's;
# FetchContent applies it only when it downloads Z3 itself), then p4/model/patches/:
# ir-visitor-erase-if-const (g++ 12's std::erase_if on a map hands the predicate a const
# element) and p4c-5753-parser-match-registers (p4c #5753: Tofino 1 parsers lose their
# match registers, every select takes its first transition).
p4c_patch_sources() {
  local src=$BUILD_DIR/src
  apply_patch "$src/z3" z3-uninstall <"$src/p4c/cmake/z3.patch"
  apply_patch "$src/p4c" ir-visitor-erase-if-const <"$P4C_PATCHES/ir-visitor-erase-if-const.patch"
  apply_patch "$src/p4c" p4c-5753-parser-match-registers \
    <"$P4C_PATCHES/p4c-5753-parser-match-registers.patch"
}

# p4c_python_env: jsl, jsonschema, pyyaml for the schema and driver scripts; pyinstaller
# for the p4c-build-logs tool, which the target that copies the driver (p4c_driver)
# depends on -- without it the build dir's p4c_src lacks driver.py.
p4c_python_env() {
  python3 -m venv "$BUILD_DIR/venv"
  "$BUILD_DIR/venv/bin/pip" install -q jsl jsonschema pyyaml pyinstaller
}

# p4c_configure [CMAKE OPTION...]: configure $BUILD_DIR/build for bf-p4c (Release, unity
# build, Tofino on, every other back end off, dependencies from $BUILD_DIR/src with
# FetchContent disconnected); the options given come last and win.
p4c_configure() {
  local src=$BUILD_DIR/src
  PATH=$BUILD_DIR/venv/bin:$PATH cmake -S "$src/p4c" -B "$BUILD_DIR/build" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON \
    -DENABLE_TOFINO=ON -DENABLE_CONTROL_PLANE=ON -DENABLE_GC=ON -DP4C_DRIVER_NAME=bf-p4c \
    -DENABLE_BMV2=OFF -DENABLE_EBPF=OFF -DENABLE_UBPF=OFF -DENABLE_DPDK=OFF -DENABLE_P4TC=OFF \
    -DENABLE_P4FMT=OFF -DENABLE_P4TEST=OFF -DENABLE_P4C_GRAPHS=OFF \
    -DENABLE_GTESTS=OFF -DENABLE_DOCS=OFF -DENABLE_LTO=OFF -DENABLE_WERROR=OFF \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_ABSEIL="$src/abseil-cpp" \
    -DFETCHCONTENT_SOURCE_DIR_PROTOBUF="$src/protobuf" \
    -DFETCHCONTENT_SOURCE_DIR_Z3="$src/z3" \
    -DFETCHCONTENT_SOURCE_DIR_BDWGC="$src/bdwgc" \
    -DFETCHCONTENT_SOURCE_DIR_P4RUNTIME="$src/p4runtime" \
    "$@"
}
