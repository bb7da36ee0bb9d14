# SPDX-License-Identifier: Apache-2.0
"""examples/python/producer.py and consumer.py across two nodes."""
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")

from pydyad_testlib import EXAMPLES_DIR, pyenv  # noqa: E402

PRODUCER = os.path.join(EXAMPLES_DIR, "producer.py")
CONSUMER = os.path.join(EXAMPLES_DIR, "consumer.py")


def start(node, script, *args, **env_extra):
    return subprocess.Popen([sys.executable, script, *args], env=pyenv(node, **env_extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait(p, timeout=120):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"example did not finish:\n{out}\n{err}")
    return p.returncode, out, err


def test_consumer_first_then_producer(cluster):
    prod, cons = cluster[0], cluster[1]
    consumer = start(cons, CONSUMER, "-n", "10", "-m", "50", DYAD_WAIT_TIMEOUT=120)
    cons.wait_waiters(1, procs=[consumer])
    assert consumer.poll() is None, "the consumer must wait for the producer"
    rc, out, err = wait(start(prod, PRODUCER, "-n", "10", "-m", "50"))
    assert rc == 0, err
    assert len(out.splitlines()) == 10
    rc, out, err = wait(consumer)
    assert rc == 0, err
    assert out.splitlines() == [f"consumed {cons.path(f'file{i}.npy')}: 50 values ok" for i in range(10)]
    for i in range(10):
        got = np.load(cons.path(f"file{i}.npy"))
        assert got.dtype == np.uint64 and np.array_equal(got, np.arange(i * 50, (i + 1) * 50, dtype=np.uint64))
    assert prod.status()["counters"]["served"] == 10


def test_consumer_detects_a_wrong_value(cluster):
    prod, cons = cluster[0], cluster[1]
    np.save(prod.path("file0.npy"), np.arange(0, 50, dtype=np.uint64))
    bad = np.arange(50, 100, dtype=np.uint64)
    bad[17] += 1
    np.save(prod.path("file1.npy"), bad)
    prod.dyad("produce", prod.path("file0.npy"), prod.path("file1.npy"))
    rc, out, err = wait(start(cons, CONSUMER, "-n", "2", "-m", "50"))
    assert rc == 1
    assert "file0.npy: 50 values ok" in out
    assert "file1.npy: value 17 is 68, expected 67" in err


def test_consumer_reports_dyad_errors(cluster):
    rc, out, err = wait(start(cluster[1], CONSUMER, "-n", "1", DYAD_WAIT_TIMEOUT=1))
    assert rc == 2
    assert "DYAD_RC_TIMEOUT" in err
