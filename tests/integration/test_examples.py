# SPDX-License-Identifier: Apache-2.0
"""DYAD's demo pairs in C (C API) and C++ (stream API) across two nodes,
consumer started first, every value checked by the consumer."""
import os
import struct
import subprocess

import pytest

import harness

EX = os.path.join(harness.BUILD, "examples")


@pytest.mark.parametrize("lang", ["c", "cpp"])
def test_pair_consumer_first(cluster, lang):
    prod, cons = cluster[0], cluster[1]
    consumer = subprocess.Popen([os.path.join(EX, f"{lang}_cons"), "10", cons.dir], env=cons.env(DYAD_WAIT_TIMEOUT=60),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cons.wait_waiters(1, procs=[consumer])
    assert consumer.poll() is None
    p = subprocess.run([os.path.join(EX, f"{lang}_prod"), "10", prod.dir], env=prod.env(), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    assert out.splitlines() == [f"File {i} validation: OK" for i in range(10)]
    for i in range(10):
        with open(cons.path(f"data{i}.txt"), "rb") as f:
            assert struct.unpack("<10i", f.read()) == tuple(range(i * 10, i * 10 + 10))


@pytest.mark.parametrize("lang", ["c", "cpp"])
def test_consumer_rejects_a_wrong_value(cluster, lang):
    prod, cons = cluster[0], cluster[1]
    with open(prod.path("data0.txt"), "wb") as f:
        f.write(struct.pack("<10i", *[0, 1, 2, 3, 4, 5, 99, 7, 8, 9]))
    prod.dyad("produce", prod.path("data0.txt"))
    p = subprocess.run([os.path.join(EX, f"{lang}_cons"), "1", cons.dir], env=cons.env(), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1
    assert "BAD" in p.stderr


@pytest.mark.parametrize("lang", ["c", "cpp"])
def test_consumer_reports_dyad_errors(cluster, lang):
    cons = cluster[1]
    p = subprocess.run([os.path.join(EX, f"{lang}_cons"), "1", cons.dir], env=cons.env(DYAD_WAIT_TIMEOUT=0.5),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "data0.txt" in p.stderr and "DYAD_WAIT_TIMEOUT" in p.stderr
