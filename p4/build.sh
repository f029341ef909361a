#!/usr/bin/env bash
# build.sh -- compile p4/switchml.p4 for Tofino 1 with bf-p4c (p4c's open-source Tofino
# back end) and record the compiler's resource summary.
#
# usage: p4/build.sh [--compiler PATH] [--out DIR] [--check-only] [-- EXTRA_BF_P4C_OPTIONS...]
#
#   --compiler PATH  the bf-p4c driver (default: $BF_P4C, else `bf-p4c` on PATH)
#   --out DIR        where the outputs go (default: p4/build, git-ignored)
#   --check-only     run p4c's p4test front end (check-p4, from $SWITCHML_CHECK_P4 or
#                    ../shared/tools/p4c/bin/check-p4) instead of bf-p4c
#
# One program serves both hardware size codes (1: 64 values, 3: 256 values with
# recirculation; p4/README.md), so there is one build: DIR/switchml/. bf-p4c writes there
#   bfrt.json                      BF Runtime schema (what p4/controller/ writes against)
#   manifest.json                  what the SDE's tools read (program, pipes, files)
#   pipe/context.json, pipe/tofino.bin   the driver's table layout and the binary
#   pipe/logs/resources.json, phv.json, table_summary.log, phv_allocation_summary_*.log
#                                  resource use (written because of -g)
# and this script adds BUILD-INFO.txt (compiler version, command, exit status),
# compile.log, pipe/logs/mau.resources.log (p4c-build-logs, when found: $BF_P4C_BUILD_LOGS,
# on PATH, or in the bf-p4c build tree) and resources.txt (the per-stage resource table
# of resource_summary.py, printed at the end). Exit status: bf-p4c's.
#
# A bf-p4c Python driver is run through bf_p4c_shim.py (the driver bug p4c #5750 fixes).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
program=$here/switchml.p4
out=$here/build
compiler=${BF_P4C:-}
check_only=0
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --compiler) compiler=${2:?--compiler needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --check-only) check_only=1; shift ;;
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "build.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$check_only" = 1 ]; then
  check=${SWITCHML_CHECK_P4:-$here/../../shared/tools/p4c/bin/check-p4}
  if [ ! -x "$check" ]; then
    echo "build.sh: no check-p4 at $check: set SWITCHML_CHECK_P4 to the p4test wrapper (p4/README.md, Building)" >&2
    exit 127
  fi
  bindir=$(dirname "$(readlink -f "$check")")
  if [ -f "$bindir/p4include" ] && [ -x "$bindir/p4test" ]; then
    # A copy of the tool that turned its p4include -> ../include link into a file: p4test
    # takes its include directory from beside its own binary, so run a copy whose link is
    # right (kept under $out; no change to the tool itself).
    fixed=$out/check-p4/bin
    if [ ! -x "$fixed/p4test" ] || [ "$bindir/p4test" -nt "$fixed/p4test" ]; then
      mkdir -p "$fixed"
      cp "$bindir/p4test" "$bindir/check-p4" "$fixed/"
      ln -sfn "$(dirname "$bindir")/include" "$fixed/p4include"
    fi
    check=$fixed/check-p4
  fi
  echo "== check-p4 $program ${extra[*]}"
  exec "$check" "$program" "${extra[@]}"
fi

if [ -z "$compiler" ]; then
  compiler=$(command -v bf-p4c || true)
fi
if [ -z "$compiler" ]; then
  echo "build.sh: no bf-p4c found: put it on PATH, set BF_P4C=/path/to/bf-p4c or pass --compiler PATH" >&2
  exit 127
fi
if [ ! -x "$compiler" ]; then
  echo "build.sh: the compiler '$compiler' is not an executable file" >&2
  exit 127
fi

dir=$out/switchml
rm -rf "$dir"
mkdir -p "$dir"
cmd=("$compiler" --std p4-16 --target tofino --arch tna -g -o "$dir" "${extra[@]}" "$program")
run=("${cmd[@]}")
if head -n 1 "$compiler" | grep -q python; then
  # p4c's Python driver: run it through bf_p4c_shim.py, which works around the driver
  # bug that p4c #5750 fixes (a Path where a str is expected stops it at the assembler).
  run=("${BF_P4C_PYTHON:-python3}" "$here/bf_p4c_shim.py" "${cmd[@]}")
fi
version=$("$compiler" --version 2>&1 | head -n 3 || true)
# bf-p4c empties its output directory when it starts: the log and BUILD-INFO.txt are
# written beside it and moved in afterwards.
info=$out/.switchml-BUILD-INFO.txt
log=$out/.switchml-compile.log
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "compiler: $compiler"
  echo "version: $version"
  echo "source commit: $(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "command: ${cmd[*]}"
} >"$info"

echo "== ${cmd[*]}"
status=0
"${run[@]}" 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
echo "exit status: $status" >>"$info"
mkdir -p "$dir"
mv -f "$info" "$dir/BUILD-INFO.txt"
mv -f "$log" "$dir/compile.log"

# The resource summary: the compiler's mau.resources.log when p4c-build-logs (built
# with bf-p4c, run by its driver only with --verbose and only from an install) is
# found, and this project's per-stage table from resources.json / phv.json.
logs=$dir/pipe/logs
if [ -f "$logs/resources.json" ]; then
  build_logs=${BF_P4C_BUILD_LOGS:-$(command -v p4c-build-logs || true)}
  guess=$(dirname "$(readlink -f "$compiler")")/backends/tofino/bf-p4c/dist/p4c-build-logs
  [ -z "$build_logs" ] && [ -x "$guess" ] && build_logs=$guess
  if [ -n "$build_logs" ] && [ ! -f "$logs/mau.resources.log" ]; then
    "$build_logs" "$dir/pipe/context.json" -r "$logs/resources.json" -p "$logs/power.json" \
      -m "$dir/manifest.json" --disable-phv-json -o "$logs" >"$logs/p4c-build-logs.out" 2>&1 || true
  fi
  {
    python3 "$here/resource_summary.py" "$dir" || true
    [ -f "$logs/mau.resources.log" ] && { echo; echo "== $logs/mau.resources.log"; cat "$logs/mau.resources.log"; }
    [ -f "$dir/bfrt.json" ] && { echo; echo "bfrt.json: $dir/bfrt.json"; }
  } >"$dir/resources.txt"
  python3 "$here/resource_summary.py" "$dir" || true
fi
broken=$(grep -c "Can't match parser state due to previous match" "$dir/compile.log" || true)
if [ "$status" = 0 ] && [ "${broken:-0}" != 0 ]; then
  # p4c #5063 drops Tofino 1 parser match registers (fixed by p4c #5753): every select
  # then takes its first branch. The binary is not usable; the resource figures are.
  echo "build.sh: WARNING: $broken parser transitions can never match (bf-p4c without p4c #5753): the binary's parser ignores its selects" >&2
fi
if [ "$status" != 0 ]; then
  echo "build.sh: bf-p4c failed (exit status $status); log in $dir/compile.log" >&2
fi
exit "$status"
