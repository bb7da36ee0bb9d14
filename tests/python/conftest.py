# SPDX-License-Identifier: Apache-2.0
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pydyad_testlib import harness  # noqa: E402


@pytest.fixture
def cluster():
    """Two nodes: node0 (127.0.0.1, hosts the metadata) and node1 (127.0.0.2)."""
    c = harness.Cluster(nodes=2)
    yield c
    c.cleanup()
