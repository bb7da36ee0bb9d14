#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and installs ADIOS2 for the stream rows of `make bench-outside`
# (issue 49) from a local source tree: nothing is downloaded, nothing of ADIOS2
# is copied into this repository. ADIOS2 is not in Debian 12.
#
#   ADIOS2_SRC=/path/to/ADIOS2     a source tree of github ornladios/ADIOS2, tag v2.12.1
#                                  (e.g. `git --git-dir=MIRROR archive v2.12.1 | tar -x -C DIR`)
#   ADIOS2_DIR=/path/to/install    where it is installed (default: $ADIOS2_SRC/../adios2)
#   ADIOS2_REF="v2.12.1 f5267290f0"  the tag and commit, recorded beside the install
#                                  (read from git when ADIOS2_SRC is a git tree)
#   ADIOS2_JOBS=1                  build jobs (default 1: ~16 min on an idle core,
#                                  284 steps; the bench needs it once)
#   bash scripts/bench-outside-adios2.sh
#   make bench-outside ADIOS2_DIR=/path/to/install
#
# What is on: SST (the staging engine the stream rows compare with; its TCP
# "WAN" data plane works between network namespaces), SysVShMem, BP5 (always
# built). Off: MPI (bench/outside/adios2_frames.cpp is one process per side,
# ADIOS2's serial library is enough), Python, Fortran, HDF5, every compressor,
# ZeroMQ/DataMan, UCX/libfabric (no RDMA here), Campaign, testing, examples.
# Prints the install prefix on its last line.
set -euo pipefail

die() { echo "bench-outside-adios2: $*" >&2; exit 1; }
[ -n "${ADIOS2_SRC:-}" ] || die "set ADIOS2_SRC to a source tree of github ornladios/ADIOS2 (tag v2.12.1)"
ADIOS2_SRC=$(cd "$ADIOS2_SRC" && pwd) || die "ADIOS2_SRC=$ADIOS2_SRC is not a directory"
[ -f "$ADIOS2_SRC/bindings/CXX/adios2.h" ] || die "$ADIOS2_SRC has no bindings/CXX/adios2.h: not an ADIOS2 source tree"
version=$(sed -n 's/^setup_version(\([0-9.]*\)).*/\1/p' "$ADIOS2_SRC/CMakeLists.txt" | head -1)
case "$version" in
  2.12.*) ;;
  *) echo "bench-outside-adios2: note: $ADIOS2_SRC is ADIOS2 '${version:-unknown}', the bench was measured with 2.12.1" >&2 ;;
esac
command -v cmake >/dev/null || die "cmake is missing: make deps"
PREFIX=${ADIOS2_DIR:-$(dirname "$ADIOS2_SRC")/adios2}
BUILD=${ADIOS2_BUILD:-$(dirname "$ADIOS2_SRC")/adios2-build}
JOBS=${ADIOS2_JOBS:-1}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

off=(Python Fortran HDF5 HDF5_VOL MPI BigWhoop Blosc2 BZip2 Caliper ZFP SZ SZ3 LIBPRESSIO MGARD PRODM PNG
     DAOS DataMan DataSpaces MHS ZeroMQ IME UCX Sodium Catalyst Campaign OpenSSL XRootD CURL Profiling)
opts=()
for o in "${off[@]}"; do opts+=("-DADIOS2_USE_$o=OFF"); done
cmake -S "$ADIOS2_SRC" -B "$BUILD" "${gen[@]}" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DADIOS2_USE_SST=ON -DADIOS2_USE_SysVShMem=ON "${opts[@]}" \
  -DADIOS2_BUILD_EXAMPLES=OFF -DBUILD_TESTING=OFF
nice -n 15 cmake --build "$BUILD" -j "$JOBS"
cmake --install "$BUILD" >/dev/null
[ -f "$PREFIX/include/adios2.h" ] || die "the install in $PREFIX has no include/adios2.h"
# The source the install came from, for the bench's tables: ADIOS2_REF names
# it when ADIOS2_SRC is not a git tree (e.g. "v2.12.1 f5267290f0" for an archive).
ref=${ADIOS2_REF:-$(git -C "$ADIOS2_SRC" describe --tags --always 2>/dev/null || true)}
commit=$(git -C "$ADIOS2_SRC" rev-parse --short=10 HEAD 2>/dev/null || true)
src="${ref:-source not recorded}${commit:+ $commit}, SST on, MPI off"
echo "$src" > "$PREFIX/bench-outside-adios2.txt"
echo "bench-outside-adios2: ADIOS2 $version ($src) in $PREFIX"
echo "$PREFIX"
