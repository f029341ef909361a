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
# below; GIT_BASE (a template with {owner} and {name}) points at a mirror instead, and
# SRC_<NAME> (P4C, ABSEIL_CPP, PROTOBUF, Z3, BDWGC, P4RUNTIME, SPDLOG) at one repository or a
# plain source tree. Debian packages needed: see p4/README.md, "Running on the Tofino model".
#
# The result: DIR/build/bf-p4c (export BF_P4C=DIR/build/bf-p4c; the driver wants
# DIR/venv/bin on PATH for its Python modules).

set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=buildlib.sh
. "$here/buildlib.sh"

# Pinned revisions: p4c and the dependency revisions its CMake files name. P4C_REV may be
# set to a later p4c (one with #5753 and #5750 upstream); its dependency pins may differ.
P4C_REV=${P4C_REV:-34b86e9bacb932c799aaf1b83495ce1e386ea047}
ABSEIL_REV=20240722.1
PROTOBUF_REV=v25.3
Z3_REV=z3-4.13.3
BDWGC_REV=7f1503dbfe254e77678666a0e09b735add064b57 # 8.2.6
P4RUNTIME_REV=ec4eb5ef70dbcbcbf2f8357a4b2b8c2f218845a5
SPDLOG_REV=v1.8.3

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
src=$BUILD_DIR/src
p4c=$src/p4c
log "bf-p4c build in $BUILD_DIR, $jobs jobs"

get_sources() {
  rm -f "$BUILD_DIR"/stamps/patch-*
  fetch_src p4c p4lang/p4c "$P4C_REV" "$p4c"
  fetch_src abseil-cpp abseil/abseil-cpp "$ABSEIL_REV" "$src/abseil-cpp"
  fetch_src protobuf protocolbuffers/protobuf "$PROTOBUF_REV" "$src/protobuf"
  fetch_src z3 Z3Prover/z3 "$Z3_REV" "$src/z3"
  fetch_src bdwgc ivmai/bdwgc "$BDWGC_REV" "$src/bdwgc"
  fetch_src p4runtime p4lang/p4runtime "$P4RUNTIME_REV" "$src/p4runtime"
  # The Tofino back end takes spdlog from third_party/ when it is there.
  fetch_src spdlog gabime/spdlog "$SPDLOG_REV" "$p4c/backends/tofino/third_party/spdlog"
}

patch_sources() {
  # p4c's own patch for Z3 (its uninstall target clashes with p4c's); FetchContent applies
  # it only when it downloads Z3 itself.
  apply_patch "$src/z3" z3-uninstall <"$p4c/cmake/z3.patch"
  # g++ 12's std::erase_if on a map hands the predicate a const element: take it const.
  apply_patch "$p4c" ir-visitor-erase-if-const <<'EOF'
--- a/ir/visitor.cpp
+++ b/ir/visitor.cpp
@@ -644,8 +644,8 @@
     applySetupJoinPoints(root);
 #if DEBUG_FLOW_JOIN
     erase_if(*flow_join_points,
-             [this](flow_join_points_t::value_type &el) { return el.second.count == 0; });
+             [](const flow_join_points_t::value_type &el) { return el.second.count == 0; });
 #endif
     erase_if(*flow_join_points,
-             [this](flow_join_points_t::value_type &el) { return filter_join_point(el.first); });
+             [this](const flow_join_points_t::value_type &el) { return filter_join_point(el.first); });
 }
EOF
  # p4c #5753: Tofino 1 parsers lose their match registers (every select takes its first
  # transition) because bind_use keeps only the scratch-register slices. Keep the others.
  apply_patch "$p4c" p4c-5753-parser-match-registers <<'EOF'
--- a/backends/tofino/bf-p4c/parde/allocate_parser_match_register.cpp
+++ b/backends/tofino/bf-p4c/parde/allocate_parser_match_register.cpp
@@ -1406,7 +1406,11 @@
 
             // Map scratch register with match register allocated by scratch groups.
             for (const auto &reg_slice : reg_slices) {
-                if (!is_scratch_register(reg_slice.first)) continue;
+                if (!is_scratch_register(reg_slice.first)) {
+                    serializable_reg_slices.emplace_back(MatchRegister(reg_slice.first),
+                                                         reg_slice.second);
+                    continue;
+                }
 
                 cstring name = reg_slice.first.name;
 
EOF
}

python_env() {
  # jsl, jsonschema, pyyaml: the schema and driver scripts; pyinstaller: the
  # p4c-build-logs tool, which the target that copies the driver (p4c_driver)
  # depends on -- without it the build dir's p4c_src lacks driver.py.
  python3 -m venv "$BUILD_DIR/venv"
  "$BUILD_DIR/venv/bin/pip" install -q jsl jsonschema pyyaml pyinstaller
}

configure() {
  PATH=$BUILD_DIR/venv/bin:$PATH cmake -S "$p4c" -B "$BUILD_DIR/build" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON \
    -DENABLE_TOFINO=ON -DENABLE_CONTROL_PLANE=ON -DENABLE_GC=ON -DP4C_DRIVER_NAME=bf-p4c \
    -DENABLE_BMV2=OFF -DENABLE_EBPF=OFF -DENABLE_UBPF=OFF -DENABLE_DPDK=OFF -DENABLE_P4TC=OFF \
    -DENABLE_P4FMT=OFF -DENABLE_P4TEST=OFF -DENABLE_P4C_GRAPHS=OFF -DENABLE_TEST_TOOLS=OFF \
    -DENABLE_GTESTS=OFF -DENABLE_DOCS=OFF -DENABLE_LTO=OFF -DENABLE_WERROR=OFF \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_ABSEIL="$src/abseil-cpp" \
    -DFETCHCONTENT_SOURCE_DIR_PROTOBUF="$src/protobuf" \
    -DFETCHCONTENT_SOURCE_DIR_Z3="$src/z3" \
    -DFETCHCONTENT_SOURCE_DIR_BDWGC="$src/bdwgc" \
    -DFETCHCONTENT_SOURCE_DIR_P4RUNTIME="$src/p4runtime"
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

step sources get_sources
patch_sources
step python python_env
step configure configure
step compile compile
step check check
finish "$started"
log "done: export BF_P4C=$BUILD_DIR/build/bf-p4c PATH=$BUILD_DIR/venv/bin:\$PATH"
