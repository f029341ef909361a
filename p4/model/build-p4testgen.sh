#!/usr/bin/env bash
# Build p4testgen (p4c's P4Testgen with its Tofino target) outside the repository,
# resumably; by default the same build directory also gives bf-p4c.
#
# usage: p4/model/build-p4testgen.sh [--dir DIR] [--jobs N] [--no-bf-p4c] [--background]
#                                    [--status]
#   --dir DIR     the build directory (default $P4TESTGEN_BUILD_DIR, else
#                 ~/.cache/switchml-emu/p4testgen)
#   --jobs N      parallel compile jobs (default: min(nproc, available GiB / 6))
#   --no-bf-p4c   build the p4testgen target only (not the rest of the Tofino back end)
#   --background  run detached at idle priority; follow DIR/build.log and DIR/STATUS
#   --status      print DIR/STATUS and the last lines of the log
#
# One p4c configured with the Tofino back end and the test tools (as p4c's own CI does):
# p4testgen's Tofino target needs ENABLE_TOFINO (its IR and a few of its passes), so both
# share Z3, protobuf, abseil, the front and mid end and the IR; p4testgen is built first,
# then the rest (bf-p4c). A directory of its own: the test tools add IR classes, so a
# bf-p4c-only build directory would be rebuilt whole. Sources and patches as in
# build-bf-p4c.sh (GIT_BASE, SRC_<NAME>, also SRC_INJA), plus p4/model/patches/testgen-*.patch
# (applied at build; a patch added later drops the compile stamps, make rebuilds what it
# touches). Debian packages: p4/README.md, "Running on the Tofino model".
#
# The results: DIR/build/p4testgen and DIR/build/bf-p4c (with DIR/venv/bin on PATH).

set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=buildlib.sh
. "$here/buildlib.sh"

INJA_REV=3741c73ba78babd2ed88f2acf2fcd6dafdb878e8 # p4c's testgen/CMakeLists.txt

BUILD_DIR=${P4TESTGEN_BUILD_DIR:-$HOME/.cache/switchml-emu/p4testgen}
jobs=""
background=0
with_bf_p4c=1
args=("$@")
while (($#)); do
  case $1 in
    --dir) BUILD_DIR=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-bf-p4c) with_bf_p4c=0; shift ;;
    --background) background=1; shift ;;
    --status) print_status; exit 0 ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
begin_build "$0" "$background" "${args[@]}"

[[ -n $jobs ]] || jobs=$(jobs_for_memory 6) # bf-p4c's largest process: 5.2 GB
started=$(date +%s)
log "p4testgen build in $BUILD_DIR, $jobs jobs"

get_sources() {
  p4c_get_sources
  fetch_src inja pantor/inja "$INJA_REV" "$BUILD_DIR/src/inja"
}

patch_testgen() {
  local p name new=0
  for p in "$here"/patches/testgen-*.patch; do
    [[ -e $p ]] || continue
    name=$(basename "$p" .patch)
    [[ -e $BUILD_DIR/stamps/patch-$name ]] || new=1
    apply_patch "$BUILD_DIR/src/p4c" "$name" <"$p"
  done
  if ((new)); then rm -f "$BUILD_DIR"/stamps/compile*; fi
}

configure() {
  # The Tofino target only: the others' tests and back ends are not built. testgen's
  # Tofino target switches p4c-graphs on itself.
  p4c_configure -DENABLE_TEST_TOOLS=ON -DENABLE_TOOLS_MODULE_SMITH=OFF \
    -DENABLE_TOOLS_TARGET_BMV2=OFF -DENABLE_TOOLS_TARGET_EBPF=OFF \
    -DENABLE_TOOLS_TARGET_PNA=OFF -DENABLE_TOOLS_TARGET_TOFINO=ON \
    -DFETCHCONTENT_SOURCE_DIR_INJA="$BUILD_DIR/src/inja"
}

build() {
  # -k: one failing translation unit does not stop the others.
  PATH=$BUILD_DIR/venv/bin:$PATH cmake --build "$BUILD_DIR/build" -j "$jobs" "$@" -- -k
}

check() {
  [[ -x $BUILD_DIR/build/p4testgen ]] || die "the build ended without build/p4testgen"
  "$BUILD_DIR/build/p4testgen" --target tofino --arch tna --version  # it wants a target
  if ((with_bf_p4c)); then
    [[ -x $BUILD_DIR/build/bf-p4c && -x $BUILD_DIR/build/p4c-barefoot ]] ||
      die "the build ended without build/bf-p4c and build/p4c-barefoot"
    PATH=$BUILD_DIR/venv/bin:$PATH "$BUILD_DIR/build/bf-p4c" --version
  fi
}

step sources get_sources
p4c_patch_sources
patch_testgen
step python p4c_python_env
step configure configure
step compile-p4testgen build --target p4testgen
((with_bf_p4c)) && step compile build
step check check
finish "$started"
log "done: $BUILD_DIR/build/p4testgen; python -m p4.testgen.generate --p4testgen $BUILD_DIR/build/p4testgen"
((with_bf_p4c)) && log "bf-p4c: export BF_P4C=$BUILD_DIR/build/bf-p4c PATH=$BUILD_DIR/venv/bin:\$PATH"
true
