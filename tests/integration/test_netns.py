# SPDX-License-Identifier: Apache-2.0
"""Two nodes as network namespaces joined by veth pairs on a bridge: the
consumer cannot see the producer's loopback, every byte crosses a veth.
Falls back to loopback addresses where namespaces cannot be made."""
import hashlib
import json
import os

import pytest

import harness


@pytest.fixture
def ncluster():
    c = harness.Cluster(nodes=2, netns=True)
    print(f"cluster mode: {c.mode}")
    yield c
    c.cleanup()


def test_consumer_first_across_namespaces(ncluster):
    prod, cons = ncluster[0], ncluster[1]
    sizes = [0, 1, 65536, 1 << 20, 7_000_001, 32 << 20]
    names = [f"ns/f{i}.bin" for i in range(len(sizes))]
    consumer = cons.dyad_async("--json", "consume", *[cons.path(n) for n in names],
                               env_extra={"DYAD_WAIT_TIMEOUT": 60})
    cons.wait_waiters(1, procs=[consumer])
    for i, (n, s) in enumerate(zip(names, sizes)):
        harness.write_file(prod.path(n), s, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    out, err = consumer.communicate(timeout=120)
    assert consumer.returncode == 0, err
    reports = [json.loads(l) for l in out.splitlines()]
    assert all(r["action"] == "fetched" for r in reports)
    assert all(r["endpoint"] == prod.uri for r in reports)
    h = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
    for n in names:
        assert h(cons.path(n)) == h(prod.path(n))
    if ncluster.mode == "netns":
        # The producer's service is not reachable on the consumer's loopback.
        p = cons.dyad("consume", cons.path("x"), check=False,
                      env_extra={"DYAD_SERVICE_URI": f"tcp://127.0.0.1:{prod.port}", "DYAD_WAIT_TIMEOUT": 1})
        assert p.returncode == 4
