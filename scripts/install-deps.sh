#!/usr/bin/env bash
# Installs every Debian package the build, tests, demo and benchmarks need.
# Idempotent: skips apt entirely when everything is already present.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config clang-format
  libasio-dev libboost-dev nlohmann-json3-dev libspdlog-dev libcli11-dev libxxhash-dev libsodium-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libucx-dev ucx-utils libfabric-dev libfabric-bin
  etcd-server etcd-client
  iperf3 iproute2 procps psmisc
  python3 python3-pytest python3-numpy python3-h5py python3-torch
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
