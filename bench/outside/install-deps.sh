#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Debian 12 packages `make bench-outside` needs beyond scripts/install-deps.sh
# (which `make deps` runs and which this script does not touch): MPI, and what
# DLIO (github argonne-lcf/dlio_benchmark, main branch) and hydra-core import.
# Idempotent: skips apt when everything is present. Enables no service.
# DLIO and hydra-core themselves are not in Debian: scripts/bench-outside-setup.sh
# installs them from local source trees (DLIO_SRC, HYDRA_SRC) into a venv.
set -euo pipefail

PKGS=(
  openmpi-bin          # mpirun: DLIO's ranks and the MPI send/recv reference row
  libopenmpi-dev       # mpi4py's runtime needs OpenMPI's libraries
  python3-mpi4py       # DLIO's communicator and bench/outside/mpi_frames.py
  python3-torch        # DLIO's PyTorch data loader and pydyad.dlio
  python3-omegaconf    # hydra-core (DLIO's configuration)
  python3-antlr4       # hydra-core's override grammar at run time
  default-jre-headless # hydra-core's setup.py builds its ANTLR grammar with Java
  python3-h5py         # DLIO's hdf5 reader/generator (imported at start)
  python3-pandas       # DLIO's post-processing
  python3-psutil       # DLIO's statistics
  python3-pil          # DLIO's image formats
  python3-yaml         # DLIO's configuration
  python3-numpy        # everything
  python3-matplotlib   # the bench's PNG charts
  python3-venv         # the venv scripts/bench-outside-setup.sh makes
  python3-pip          # pip install --no-build-isolation --no-deps of local sources (no index)
  python3-setuptools   # building hydra-core and DLIO from their sources
  python3-wheel
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "bench-outside deps: all present"
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "bench-outside deps: installing ${missing[*]}"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
