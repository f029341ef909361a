#!/usr/bin/env bash
# Build bf-p4c (p4c with its Tofino back end) outside the repository, resumably.
#
# usage: p4/model/build-bf-p4c.sh [--dir DIR] [--jobs N] [--background] [--status]
#   --dir DIR     the build directory (default $BF_P4C_BUILD_DIR, else
#                 ~/.cache/switchml-emu/bf-p4c)
#   --jobs N      parallel compile jobs (default: min(nproc, available GiB / 6))
#   --background  run detached at idle priority; follow DIR/build.log and DIR/STATUS
#   --status      print DIR/STATUS and the last lines of the log
#
# Re-running continues where the last run stopped (stamps in DIR/stamps, make's own
# dependency tracking inside the compile step). Sources come from GitHub at the revisions
# pinned in buildlib.sh (P4C_REV and the rest), patched from p4/model/patches/; GIT_BASE (a
# template with {owner} and {name}) points at a mirror instead, and SRC_<NAME> (P4C,
# ABSEIL_CPP, PROTOBUF, Z3, BDWGC, P4RUNTIME, SPDLOG) at one repository or a plain source
# tree. Debian packages needed: see p4/README.md, "Running on the Tofino model".
#
# The result: DIR/build/bf-p4c (export BF_P4C=DIR/build/bf-p4c; the driver wants
# DIR/venv/bin on PATH for its Python modules).

set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=buildlib.sh
. "$here/buildlib.sh"

BUILD_DIR=${BF_P4C_BUILD_DIR:-$HOME/.cache/switchml-emu/bf-p4c}
jobs=""
background=0
args=("$@")
while (($#)); do
  case $1 in
    --dir) BUILD_DIR=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --background) background=1; shift ;;
    --status) print_status; exit 0 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
begin_build "$0" "$background" "${args[@]}"

[[ -n $jobs ]] || jobs=$(jobs_for_memory 6) # its largest process: 5.2 GB (p4/README.md)
started=$(date +%s)
log "bf-p4c build in $BUILD_DIR, $jobs jobs"

configure() {
  p4c_configure -DENABLE_TEST_TOOLS=OFF
}

compile() {
  # -k: one failing translation unit does not stop the others (an unattended build gets
  # as far as it can; after a fix, a re-run compiles only what is left).
  PATH=$BUILD_DIR/venv/bin:$PATH cmake --build "$BUILD_DIR/build" -j "$jobs" -- -k
}

check() {
  [[ -x $BUILD_DIR/build/bf-p4c && -x $BUILD_DIR/build/p4c-barefoot ]] ||
    die "the build ended without build/bf-p4c and build/p4c-barefoot"
  PATH=$BUILD_DIR/venv/bin:$PATH "$BUILD_DIR/build/bf-p4c" --version
}

step sources p4c_get_sources
p4c_patch_sources
step python p4c_python_env
step configure configure
step compile compile
step check check
finish "$started"
log "done: export BF_P4C=$BUILD_DIR/build/bf-p4c PATH=$BUILD_DIR/venv/bin:\$PATH"
