# SPDX-License-Identifier: Apache-2.0
"""The producer's service dies mid-transfer: error, no partial file, recovery."""
import glob
import hashlib
import os
import time

import harness


def test_producer_killed_mid_transfer_then_restarted(cluster3):
    meta, prod, cons = cluster3[0], cluster3[1], cluster3[2]
    size = 1 << 30
    harness.write_file(prod.path("huge.bin"), size, seed=11)
    prod.dyad("produce", prod.path("huge.bin"))
    target = cons.path("huge.bin")
    consumer = cons.dyad_async("consume", target, env_extra={"DYAD_WAIT_TIMEOUT": 30, "DYAD_TRANSFER_TIMEOUT": 20})
    # Kill the producer's service as soon as bytes start landing.
    killed = harness.kill_when_transfer_starts(prod, consumer, cons.dir, "huge.bin")
    assert killed, "the transfer finished before it could be interrupted"
    t0 = time.monotonic()
    out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 5, (consumer.returncode, err)
    assert "huge.bin" in err
    assert time.monotonic() - t0 < 20
    assert not os.path.exists(target), "a partial file became visible"
    assert glob.glob(os.path.join(cons.dir, ".huge.bin.dyad-*")) == [], "temporary file left behind"
    # The service comes back on the same address: the same consume succeeds.
    prod.start()
    p = cons.dyad("consume", target, env_extra={"DYAD_WAIT_TIMEOUT": 30})
    assert p.returncode == 0
    assert os.path.getsize(target) == size
    h = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
    assert h(target) == h(prod.path("huge.bin"))


def test_metadata_host_gone_ends_the_wait_at_its_deadline_not_before(cluster3):
    # A waiting consumer rides through a restart of the store host (see
    # test_store.py); one that never comes back ends the wait at the
    # consumer's own deadline, with an error (4: the store could not be
    # reached) that names the store, not "not produced" (issue 33).
    meta, prod, cons = cluster3[0], cluster3[1], cluster3[2]
    consumer = cons.dyad_async("consume", cons.path("later.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 3})
    cons.wait_waiters(1, procs=[consumer])  # it waits on the metadata host's store
    meta.kill()
    out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 4, err
    assert "lost while waiting" in err and "was not produced" not in err, err
    assert f"the metadata store at {meta.uri} is unreachable" in err, err
    assert "DYAD retried until the wait's deadline" in err, err
