#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs exactly the Debian 12 packages DYAD uses, and enables or starts no
# system service. One argument says for what (default: all):
#   build  the build and `make demo` (compilers, the libraries DYAD links, ip,
#          python3): about 100 packages, a few minutes on a fresh machine
#   test   build + what `make test` runs beside DYAD (etcd, Slurm and munge,
#          GlusterFS, PyTorch, h5py, pytest, rsync, ...)
#   bench  test + the baselines and charts of `make bench` (iperf3, socat,
#          strace, matplotlib)
#   all    everything (= bench)
# The Makefile asks for the smallest set a target needs, so `make demo` does
# not wait for PyTorch and GlusterFS. Idempotent: skips apt entirely when
# everything asked for is already present.
set -euo pipefail

PROFILE=${1:-all}
case "$PROFILE" in
  build | test | bench | all) ;;
  *)
    echo "install-deps: unknown set '$PROFILE' (use build, test, bench or all)" >&2
    exit 2
    ;;
esac

PKGS_BUILD=(
  # -- build (CMakeLists.txt, Makefile) and make demo --
  build-essential      # gcc/g++, make; also binutils (readelf, nm: tests/integration)
  cmake                # the build system
  ninja-build          # cmake -G Ninja (Makefile)
  pkg-config           # pkg_check_modules for UCX and libfabric (src/dtl)
  clang-format         # make format / make check-format
  help2man             # man pages of dyadd and dyad (packaging/)
  libasio-dev          # framed RPC over TCP/Unix sockets (src/rpc)
  libboost-dev         # Boost.Beast: dyadd's /metrics and /healthz (src/service/metrics_http.cpp)
  libspdlog-dev        # the log backend, header-only (src/common/log.cpp)
  nlohmann-json3-dev   # JSON records and replies (src/client, src/kvs, tools)
  libcli11-dev         # command lines of dyadd and dyad
  libxxhash-dev        # checksums and key hashing (src/common)
  libsodium-dev        # the job key's authentication (src/common/auth.cpp)
  libssl-dev           # OpenSSL: the certificates of a job's own etcd, derived from its key (tools/job/etcd_tls.cpp)
  libsqlite3-dev       # the publish ledger kept across dyadd restarts (src/service/ledger_journal.cpp, dyadd only)
  libgtest-dev         # unit tests (tests/CMakeLists.txt: GTest::gtest_main), built with everything else
  libslurm-dev         # <slurm/spank.h>: dyad_spank.so is built only where it is found (headers only)
  # -- the etcd backend of the metadata store (src/kvs/etcd, dyadd only) --
  libgrpc++-dev        # etcd's v3 API is gRPC
  libprotobuf-dev      # its messages
  protobuf-compiler    # protoc: src/kvs/etcd/etcd.proto -> C++
  protobuf-compiler-grpc  # grpc_cpp_plugin: the gRPC stubs
  # -- transports --
  libucx-dev           # DYAD_DTL_MODE=UCX (src/dtl)
  libfabric-dev        # DYAD_DTL_MODE=MARGO/OFI (src/dtl, bench/ofi_read_bw.cpp)
  # -- make demo --
  iproute2             # ip, ss: the harness's loopback addresses and network namespaces (scripts/harness.py)
  python3              # the demo, tests, benchmarks, pydyad
)

PKGS_TEST=(
  ucx-utils            # ucx_info (tests), ucx_perftest (bench/ucx_bench.py)
  libfabric-bin        # fi_info (tests/integration)
  etcd-server          # /usr/bin/etcd: the etcd metadata store (dyadd --kvs etcd://); tests and benchmarks
                       # start their own (scripts/harness.py Etcd); the distribution's service is disabled below
  etcd-client          # etcdctl: health checks of the tests' etcd, the etcdctl baseline of make bench
  rsync                # rsync daemon baseline of make bench (bench/references.py, its own daemon on a free
                       # port), rsync in job scripts (tests); the distribution's service is disabled below
  acl                  # setfacl: the ACL case of the node-wide service's test (tests/integration/test_nodewide.py)
  python3-pytest       # every Python test (ctest runs pytest)
  python3-pytest-timeout  # a hanging test fails after 300 s with every thread's stack (tests/CMakeLists.txt)
  python3-venv         # pip install ./python into a fresh venv (tests/python/test_pydyad_install.py)
  python3-numpy        # examples/python, pydyad.torch
  python3-h5py         # pydyad.hdf and its tests
  python3-torch        # pydyad.torch and its tests
  python3-matplotlib   # bench/plot.py: the PNG charts of make bench (and its test)
  glusterfs-server     # make bench-workflow and its smoke test: the GlusterFS baseline (bench/workflow/gluster.py
                       # runs its own glusterd in a namespace); the distribution's services are disabled below
  glusterfs-client     # mount -t glusterfs (FUSE) on every namespace node of that bench
  # -- Slurm: the SPANK plugin's tests (tests/slurm) --
  slurmctld            # the tests' controller (their own, in the root namespace); its service is disabled below
  slurmd               # the tests' node daemons (one per network namespace); its service is disabled below
  slurm-client         # sbatch, srun, salloc, scancel, squeue, scontrol
  munge                # Slurm's authentication: the tests run their own munged; its service is disabled below
)

PKGS_BENCH=(
  iperf3               # TCP baseline of make bench (bench/bench.py); its daemon stays off
  socat                # tar | socat baseline of make bench (bench/references.py)
  strace               # syscall accounting of make bench (strace -f -c, bench/accounting.py)
)

PKGS=("${PKGS_BUILD[@]}")
case "$PROFILE" in
  test) PKGS+=("${PKGS_TEST[@]}") ;;
  bench | all) PKGS+=("${PKGS_TEST[@]}" "${PKGS_BENCH[@]}") ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages of the '$PROFILE' set present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive

# No service may start while packages are installed: a policy-rc.d that
# refuses every start (exit 101), unless the machine already has one, removed
# afterwards.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
  trap '$SUDO rm -f "$POLICY"' EXIT
  printf '#!/bin/sh\n# install-deps.sh: no service starts during installation\nexit 101\n' |
    $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod 755 "$POLICY"
fi
# iperf3 ships a daemon; its package enables it only if asked: say no.
for p in "${missing[@]}"; do
  if [ "$p" = iperf3 ]; then
    echo "iperf3 iperf3/start_daemon boolean false" | $SUDO debconf-set-selections
  fi
done

$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

# Stops a distribution service that a package this script installed may have
# enabled, and disables it (not mask: an administrator can still start it on
# purpose; package upgrades keep it disabled).
disable_service() {
  local name=$1
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now --quiet "$name.service"
  else
    # No systemd running (a container, sysvinit): the SysV links and, where
    # systemctl exists, the unit's symlinks (systemctl edits them offline).
    if command -v systemctl >/dev/null; then $SUDO systemctl disable --quiet "$name.service"; fi
    if $SUDO "/etc/init.d/$name" status >/dev/null 2>&1; then $SUDO "/etc/init.d/$name" stop; fi
    $SUDO update-rc.d "$name" disable >/dev/null
  fi
}

# etcd-server's maintainer scripts enable the distribution's etcd service
# (systemd unit and SysV links) and start it unless a policy-rc.d forbids it
# (ours does; a machine's own policy-rc.d may allow it). That service would
# listen on 127.0.0.1:2379 with its data in /var/lib/etcd, at every boot. DYAD
# needs none of it: its tests and benchmarks run their own etcd on free ports
# with a temporary data directory.
# rsync's (Debian 12) leaves its systemd unit disabled but adds the SysV
# links of /etc/init.d/rsync (update-rc.d defaults), which start a daemon at
# boot once /etc/default/rsync says RSYNC_ENABLE=true; the benchmark runs its
# own daemon with its own configuration. So both are disabled, only when this
# script installed them: a service a site installed before is the site's.
for p in "${missing[@]}"; do
  case "$p" in
    etcd-server)
      disable_service etcd
      echo "install-deps: etcd-server installed; its system service is stopped and disabled (DYAD's tests run their own)"
      ;;
    rsync)
      disable_service rsync
      echo "install-deps: rsync installed; its system service is stopped and disabled (make bench runs its own daemon)"
      ;;
    # The Slurm packages enable munge, slurmd and slurmctld at install (and
    # would start them without our policy-rc.d). The tests run their own
    # munged and Slurm daemons with their own configuration, sockets and
    # keys; a site's cluster runs its own, configured by the site.
    munge | slurmd | slurmctld)
      disable_service "$p"
      echo "install-deps: $p installed; its system service is stopped and disabled (tests/slurm runs its own)"
      ;;
    # glusterfs-server ships glusterd and glustereventsd units (Debian 12
    # leaves them disabled, no SysV script): make sure, the systemd units
    # only. bench/workflow starts its own glusterd in a namespace.
    glusterfs-server)
      for unit in glusterd glustereventsd; do
        if [ -d /run/systemd/system ]; then
          $SUDO systemctl disable --now --quiet "$unit.service" || true
        elif command -v systemctl >/dev/null; then
          $SUDO systemctl disable --quiet "$unit.service" || true
        fi
      done
      echo "install-deps: glusterfs-server installed; glusterd stays disabled (make bench-workflow runs its own)"
      ;;
  esac
done
