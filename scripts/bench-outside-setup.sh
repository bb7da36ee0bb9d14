#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes the Python environment `make bench-outside` runs DLIO in, from local
# source trees only: nothing is downloaded (pip runs with --no-index), nothing
# of DLIO or hydra is copied into this repository.
#
#   DLIO_SRC=/path/to/dlio_benchmark      a checkout of github argonne-lcf/dlio_benchmark
#                                         (main branch of June 2026 or later: release
#                                         2.0.0 imports TensorFlow at start-up)
#   HYDRA_SRC=/path/to/hydra              hydra-core 1.3.2's source (tag v1.3.2 of
#                                         github facebookresearch/hydra); its build needs Java
#   PYDFTRACER_SRC=/path/to/pydftracer    optional: DLIO imports dftracer.python; pure
#                                         Python, put on the venv's path (github llnl/pydftracer)
#   OUTSIDE_VENV=DIR                      the venv (default: $DLIO_SRC/../dlio-venv)
#   bash scripts/bench-outside-setup.sh
#
# The Debian packages come first: bash bench/outside/install-deps.sh (root).
# ADIOS2 (the SST and BP5 stream rows) is built from its own source tree when
# ADIOS2_SRC is set (scripts/bench-outside-adios2.sh: ADIOS2_DIR, the prefix,
# defaults to $ADIOS2_SRC/../adios2; about 16 min of one core); alone (no
# DLIO_SRC) only ADIOS2 is built. Then `make bench-outside ADIOS2_DIR=PREFIX`.
# The venv sees Debian's packages (--system-site-packages: torch, mpi4py,
# omegaconf, numpy...). Prints the venv's python on its last line.
set -euo pipefail

die() { echo "bench-outside-setup: $*" >&2; exit 1; }
if [ -n "${ADIOS2_SRC:-}" ]; then
  bash "$(dirname "$0")/bench-outside-adios2.sh"
  [ -n "${DLIO_SRC:-}" ] || exit 0  # ADIOS2 only
fi
[ -n "${DLIO_SRC:-}" ] || die "set DLIO_SRC to a checkout of github argonne-lcf/dlio_benchmark"
[ -n "${HYDRA_SRC:-}" ] || die "set HYDRA_SRC to hydra-core 1.3.2's source (github facebookresearch/hydra, tag v1.3.2)"
DLIO_SRC=$(cd "$DLIO_SRC" && pwd) || die "DLIO_SRC=$DLIO_SRC is not a directory"
HYDRA_SRC=$(cd "$HYDRA_SRC" && pwd) || die "HYDRA_SRC=$HYDRA_SRC is not a directory"
[ -f "$DLIO_SRC/dlio_benchmark/main.py" ] || die "$DLIO_SRC has no dlio_benchmark/main.py: not a DLIO checkout"
[ -f "$HYDRA_SRC/hydra/__init__.py" ] || die "$HYDRA_SRC has no hydra/__init__.py: not a hydra checkout"
grep -q '__version__ = "1.3.2"' "$HYDRA_SRC/hydra/__init__.py" ||
  echo "bench-outside-setup: note: $HYDRA_SRC is not hydra-core 1.3.2 (DLIO asks for 1.3.2)" >&2
command -v java >/dev/null || die "java is missing (hydra's grammar is built with it): bash bench/outside/install-deps.sh"
/usr/bin/python3 -c "import torch, mpi4py, omegaconf, antlr4, pandas, psutil, PIL, yaml, h5py" 2>/dev/null ||
  die "Debian's Python packages are missing: bash bench/outside/install-deps.sh"

VENV=${OUTSIDE_VENV:-$(dirname "$DLIO_SRC")/dlio-venv}
if [ ! -x "$VENV/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --no-index --no-build-isolation --no-deps --disable-pip-version-check -q)
# hydra builds its ANTLR parsers in setup.py; a source tree left read-only
# or reused is built in a scratch copy.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -a "$HYDRA_SRC" "$work/hydra"
(cd "$work/hydra" && "${PIP[@]}" .)
cp -a "$DLIO_SRC" "$work/dlio"
(cd "$work/dlio" && "${PIP[@]}" .)
if [ -n "${PYDFTRACER_SRC:-}" ]; then
  [ -d "$PYDFTRACER_SRC/python/dftracer" ] || die "PYDFTRACER_SRC=$PYDFTRACER_SRC has no python/dftracer"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$(cd "$PYDFTRACER_SRC/python" && pwd)" > "$site/pydftracer-src.pth"
fi
"$VENV/bin/python" -c "import hydra, dftracer.python, dlio_benchmark.main" ||
  die "DLIO does not import in $VENV (PYDFTRACER_SRC unset? DLIO needs dftracer.python)"
echo "bench-outside-setup: DLIO $(git -C "$DLIO_SRC" rev-parse --short HEAD 2>/dev/null || echo '(not a git tree)')," \
  "hydra $("$VENV/bin/python" -c 'import hydra; print(hydra.__version__)') in $VENV"
echo "$VENV/bin/python"
