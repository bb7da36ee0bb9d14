#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# OpenMPI's rsh agent for `make bench-outside` (mpirun --mca plm_rsh_agent):
# starts mpirun's daemon on a "node" that is a network namespace of this
# machine instead of over ssh. Called as `AGENT [OPTIONS] HOST COMMAND...`;
# HOST is a namespace's address, mapped to the namespace's name by
# OUTSIDE_NETNS_MAP ("ADDRESS=NAME ADDRESS=NAME ...", set by bench/outside/run.py).
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;  # options meant for ssh (none needed here)
    *) break ;;
  esac
done
host=$1
shift
ns=""
for pair in $OUTSIDE_NETNS_MAP; do
  [ "${pair%%=*}" = "$host" ] && ns=${pair#*=}
done
if [ -z "$ns" ]; then
  echo "nsenter-agent: no namespace for host '$host' in OUTSIDE_NETNS_MAP='$OUTSIDE_NETNS_MAP'" >&2
  exit 255
fi
exec nsenter --net="/run/netns/$ns" sh -c "$*"
