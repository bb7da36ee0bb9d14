# SPDX-License-Identifier: Apache-2.0
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import harness  # noqa: E402


@pytest.fixture
def cluster():
    c = harness.Cluster(nodes=2)
    yield c
    c.cleanup()


@pytest.fixture
def cluster3():
    """node0 hosts the metadata only; node1 produces; node2 consumes."""
    c = harness.Cluster(nodes=3)
    yield c
    c.cleanup()
