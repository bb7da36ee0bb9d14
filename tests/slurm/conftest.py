# SPDX-License-Identifier: Apache-2.0
"""A real Slurm cluster of 4 nodes (scripts/slurm_cluster.py) for the tests of
this directory: started once, removed at the end whatever happened (also on
SIGTERM from ctest). Skips, with the reason, where namespaces or Slurm
cannot run."""
import os
import signal
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import harness  # noqa: E402
import slurm_cluster  # noqa: E402


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)


def cluster_with(*plugstack_args):
    """The tests' cluster with these plugstack.conf arguments, removed at the
    end (a module's own `slurm` fixture: `yield from cluster_with(...)`);
    skips, with the reason, where it cannot run."""
    reason = slurm_cluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        c = slurm_cluster.SlurmCluster(nodes=4, plugstack_args=plugstack_args)
    except harness.NetnsUnavailable as e:
        pytest.skip(str(e))
    try:
        yield c
    finally:
        c.cleanup()


def late_program(prefix, name, delay, program, beside=()):
    """A directory every node sees (not their own /tmp) holding `name`: a
    script that sleeps `delay` s, then runs `program` with its arguments;
    `beside`: programs linked next to it. Its path."""
    base = os.path.join(harness.BUILD, "slurm-test")
    os.makedirs(base, exist_ok=True)
    d = tempfile.mkdtemp(prefix=prefix, dir=base)
    os.chmod(d, 0o755)
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nsleep {delay}\nexec {program} \"$@\"\n")
    os.chmod(path, 0o755)
    for p in beside:
        os.symlink(p, os.path.join(d, os.path.basename(p)))
    return path


@pytest.fixture(scope="module")
def slurm():
    yield from cluster_with()


@pytest.fixture
def shared(slurm, tmp_path_factory, request):
    """A directory every node sees (the nodes' /tmp are their own)."""
    d = os.path.join(slurm.root, "shared", request.node.name)
    os.makedirs(d)
    return d
