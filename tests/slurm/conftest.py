# SPDX-License-Identifier: Apache-2.0
"""A real Slurm cluster of 4 nodes (scripts/slurm_cluster.py) for the tests of
this directory: started once, removed at the end whatever happened (also on
SIGTERM from ctest). Skips, with the reason, where namespaces or Slurm
cannot run."""
import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import harness  # noqa: E402
import slurm_cluster  # noqa: E402


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)


@pytest.fixture(scope="module")
def slurm():
    reason = slurm_cluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        c = slurm_cluster.SlurmCluster(nodes=4)
    except harness.NetnsUnavailable as e:
        pytest.skip(str(e))
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def shared(slurm, tmp_path_factory, request):
    """A directory every node sees (the nodes' /tmp are their own)."""
    d = os.path.join(slurm.root, "shared", request.node.name)
    os.makedirs(d)
    return d
