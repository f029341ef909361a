#!/usr/bin/env bash
# Build open-p4studio's Tofino 1 model set-up outside the repository, resumably:
# tofino-model and bf_switchd with BF Runtime and its gRPC server (no Thrift, PI, P4Runtime,
# kernel modules, bf-python, switch, diags; no compiler: bf-p4c comes from build-bf-p4c.sh).
#
# usage: p4/model/build-model.sh [--dir DIR] [--jobs N] [--background] [--status]
#                                [--allow-missing]
#   --dir DIR        the build directory (default $MODEL_BUILD_DIR, else
#                    ~/.cache/switchml-emu/open-p4studio)
#   --jobs N         parallel compile jobs (default: min(nproc, available GiB / 3))
#   --background     run detached at idle priority; follow DIR/build.log and DIR/STATUS
#   --status         print DIR/STATUS and the last lines of the log
#   --allow-missing  go on when the checkout lacks open-p4studio's large files (a mirror
#                    without them): compile what does not need them (make -k), stop before
#                    install; re-run without the flag once the files are there
#
# Re-running continues where the last run stopped. Sources: open-p4studio from GitHub at
# the revision below (GIT_BASE, a template with {owner} and {name}, points at a mirror;
# SRC_OPEN_P4STUDIO at a clone or source tree). Its large files (the prebuilt
# tofino-model.x86_64.bin, the Tofino register headers, libport_mgr_hw.a) are ordinary git
# blobs in that repository. The result: DIR/install (SDE_INSTALL), with bin/tofino-model and
# bin/bf_switchd. Debian packages: p4/README.md, "Running on the Tofino model".

set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=buildlib.sh
. "$here/buildlib.sh"

OPEN_P4STUDIO_REV=1f97778f9ad5c8165bfce552fffe27c69887756b # 9.13.4

# The files of open-p4studio a Tofino 1 model build needs that are large binaries or
# generated headers (a partial mirror may lack them).
LARGE_FILES=(
  pkgsrc/tofino-model/tofino-model.x86_64.bin
  pkgsrc/bf-drivers/include/tofino_regs/tofino.h
  pkgsrc/bf-drivers/include/tof2_regs/tof2_reg_drv.h
  pkgsrc/bf-drivers/include/tof3_regs/tof3_reg_drv.h
  pkgsrc/bf-drivers/src/lld/reg_list_autogen.h
  pkgsrc/bf-drivers/src/lld/tof2_reg_list_autogen.h
  pkgsrc/bf-drivers/src/lld/tof3_reg_list_autogen.h
  pkgsrc/bf-drivers/src/port_mgr/port_mgr_lib/libport_mgr_hw.a
  pkgsrc/bf-drivers/src/port_mgr/port_mgr_lib/libport_mgr_hw.so
)
DEBIAN_PACKAGES=(cmake g++ make pkg-config autoconf automake libtool python3-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libboost-dev
  libedit-dev libcli-dev libssl-dev libelf-dev libffi-dev libbz2-dev libsqlite3-dev
  libjudy-dev libexpat1-dev rapidjson-dev iproute2 time)

BUILD_DIR=${MODEL_BUILD_DIR:-$HOME/.cache/switchml-emu/open-p4studio}
jobs=""
background=0
allow_missing=0
args=("$@")
while (($#)); do
  case $1 in
    --dir) BUILD_DIR=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --background) background=1; shift ;;
    --allow-missing) allow_missing=1; shift ;;
    --status) print_status; exit 0 ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
begin_build "$0" "$background" "${args[@]}"

[[ -n $jobs ]] || jobs=$(jobs_for_memory 3)
started=$(date +%s)
sde=$BUILD_DIR/src/open-p4studio
install=$BUILD_DIR/install
log "open-p4studio model build in $BUILD_DIR, $jobs jobs"

check_packages() {
  local absent=() p
  for p in "${DEBIAN_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || absent+=("$p")
  done
  ((${#absent[@]} == 0)) || die "Debian packages missing: apt-get install ${absent[*]}"
}

get_sources() {
  rm -f "$BUILD_DIR"/stamps/patch-*
  # No submodules: the only one is p4c, whose compiler build-bf-p4c.sh builds.
  fetch_src open-p4studio p4lang/open-p4studio "$OPEN_P4STUDIO_REV" "$sde"
}

missing_large_files() {
  local f
  for f in "${LARGE_FILES[@]}"; do
    if [[ ! -s $sde/$f ]] || grep -qxF "$f" "$BUILD_DIR/placeholders" 2>/dev/null; then
      echo "$f"
    fi
  done
}

patch_sources() {
  # Leave the compiler (the p4c submodule, a second bf-p4c build), the example programs
  # (compiled with it) and p4o (a prebuilt tarball) out of the build.
  apply_patch "$sde" no-compiler-no-examples <<'EOF'
--- a/CMakeLists.txt
+++ b/CMakeLists.txt
@@ -246,8 +246,7 @@
 add_subdirectory(${BF_PKG_DIR}/bf-drivers)
 
 #compiler/model
 include(FindP4CModel)
-add_subdirectory(${BF_PKG_DIR}/p4-compilers)
 
 if(ASIC AND BSP)
   #platform
@@ -270,6 +270,5 @@
 
 #p4-examples
 message(STATUS "\nBegin p4-examples setup")
-add_subdirectory(${BF_PKG_DIR}/p4-examples)
 
 file(WRITE ${CMAKE_INSTALL_PREFIX}/share/VERSION ${PROJECT_VERSION})
EOF
  apply_patch "$sde" no-p4o <<'EOF'
--- a/cmake/FindP4CModel.cmake
+++ b/cmake/FindP4CModel.cmake
@@ -31,12 +31,3 @@
 set(PDGENCLI_COMMAND ${PYTHON_COMMAND} ${PDGENCLI})
 set(PDSPLIT ${CMAKE_INSTALL_PREFIX}/bin/split_pd_thrift.py)
 set(PDSPLIT_COMMAND ${PYTHON_COMMAND} ${PDSPLIT})
-
-# install p4o
-ExternalProject_Add(bf-p4o
-  DOWNLOAD_COMMAND tar -xvf ${CMAKE_CURRENT_SOURCE_DIR}/${BF_PKG_DIR}/p4o/p4o-1.0.x86_64.tar.gz
-      -C ${CMAKE_INSTALL_PREFIX} --strip-components=1
-  CONFIGURE_COMMAND ""
-  BUILD_COMMAND ""
-  INSTALL_COMMAND ""
-)
EOF
}

# make_placeholders: stand-ins for the missing large files that CMake needs at configure
# time, listed in DIR/placeholders: headers that stop any compile including them (#error),
# an empty archive and shared library for port_mgr (bf_switchd then fails to link).
make_placeholders() {
  local f path
  for f in $(missing_large_files); do
    path=$sde/$f
    mkdir -p "$(dirname "$path")"
    case $f in
      *.h) echo "#error \"$f: absent from this open-p4studio checkout\"" >"$path" ;;
      *.a) printf '!<arch>\n' >"$path" ;;
      *.so) gcc -shared -o "$path" -x c /dev/null ;;
      *) continue ;;
    esac
    grep -qxF "$f" "$BUILD_DIR/placeholders" 2>/dev/null || echo "$f" >>"$BUILD_DIR/placeholders"
  done
}

configure() {
  mkdir -p "$install/lib"
  local extra=()
  if ((allow_missing)); then
    make_placeholders
    # One error per file that includes a placeholder, not thousands.
    [[ -s $BUILD_DIR/placeholders ]] && extra=(-DEXTRA_CPPFLAGS=-Wfatal-errors)
  fi
  cmake -S "$sde" -B "$BUILD_DIR/build" -DCMAKE_INSTALL_PREFIX="$install" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTOFINO=ON -DTOFINO2=OFF -DTOFINO2M=OFF -DTOFINO3=OFF -DASIC=OFF -DCPUVETH=ON \
    -DBFRT=ON -DGRPC=ON -DPI=OFF -DP4RT=OFF -DTDI=OFF \
    -DTHRIFT-DRIVER=OFF -DTHRIFT-SWITCH=OFF -DTHRIFT-DIAGS=OFF \
    -DKERNEL-MODULES=OFF -DSWITCH=OFF -DBF-DIAGS=OFF -DBSP=OFF \
    -DBF-PYTHON=OFF -DTCMALLOC=OFF -DLTO=OFF "${extra[@]}"
}

compile() {
  if ((allow_missing)); then
    cmake --build "$BUILD_DIR/build" -j "$jobs" -- -k || true
  else
    cmake --build "$BUILD_DIR/build" -j "$jobs"
  fi
}

install_tree() {
  cmake --install "$BUILD_DIR/build"
  [[ -x $install/bin/tofino-model && -x $install/bin/bf_switchd ]] ||
    die "the install has no bin/tofino-model or bin/bf_switchd"
}

step packages check_packages
if ((!allow_missing)) && [[ -s $BUILD_DIR/placeholders ]]; then
  log "an earlier run went on with placeholders: checking the sources out again"
  rm -f "$BUILD_DIR/placeholders" "$BUILD_DIR/stamps/sources" "$BUILD_DIR/stamps/configure"
  rm -rf "$BUILD_DIR/build"
fi
step sources get_sources
missing=$(missing_large_files | tr '\n' ' ')
missing=${missing% }
if [[ -n $missing ]]; then
  status missing_files "$missing"
  if ((!allow_missing)); then
    die "the checkout lacks open-p4studio's large files: $missing (clone from GitHub, or --allow-missing to compile the rest)"
  fi
  log "going on without: $missing"
fi
patch_sources
step configure configure
if [[ -n $missing ]]; then
  status step "compile, partial: make -k without the missing files (since $(date '+%F %T'))"
  compile
  status step "partial: compiled what does not need the missing files; re-run when they are there"
  status disk "$(du -sh "$BUILD_DIR" | cut -f1)"
  log "stopped before install: missing $missing"
  exit 0
fi
step compile compile
step install install_tree
finish "$started"
log "done: SDE_INSTALL=$install"
