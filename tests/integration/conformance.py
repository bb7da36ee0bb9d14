# SPDX-License-Identifier: Apache-2.0
"""The transport conformance cases every data transport passes (UCX, MARGO,
...). Each takes the producer and consumer nodes, the DYAD_DTL_MODE name and
the consumer environment, and asserts; the per-transport suites call them."""
import glob
import json
import os
import time

import harness

sha = harness.sha256


def sizes_consumer_first(prod, cons, mode, env, sizes):
    """The consumer waits first; every size arrives byte-identical. Returns
    the producer's counters for `mode`."""
    names = [f"sz/{k}.bin" for k in sizes]
    p = cons.dyad_async("--json", "consume", *[cons.path(n) for n in names], env_extra=env)
    cons.wait_waiters(1, procs=[p])
    for n, s in zip(names, sizes.values()):
        harness.write_file(prod.path(n), s, seed=s)
    prod.dyad("produce", *[prod.path(n) for n in names])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert [json.loads(l)["transport"] for l in out.splitlines()] == [mode] * len(names)
    for n in names:
        assert sha(cons.path(n)) == sha(prod.path(n)), n
    st = prod.status()["counters"]["per_transport"][mode]
    assert st["served"] == len(names) and st["bytes_sent"] == sum(sizes.values())
    return st


def thousand_small_files(prod, cons, mode, env):
    names = [f"small/f{i:04d}" for i in range(1000)]
    for i, n in enumerate(names):
        harness.write_file(prod.path(n), 1000 + i, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    cons.dyad("consume", *[cons.path(n) for n in names], env_extra=env, timeout=300)
    for n in names[::97]:
        assert sha(cons.path(n)) == sha(prod.path(n))
    assert prod.status()["counters"]["per_transport"][mode]["served"] == 1000


def four_concurrent_consumers(prod, cons, env):
    procs = [cons.dyad_async("consume", cons.path(f"cc{i}.bin"), env_extra=env) for i in range(4)]
    for i in range(4):
        harness.write_file(prod.path(f"cc{i}.bin"), (24 << 20) + i, seed=i)
    prod.dyad("produce", *[prod.path(f"cc{i}.bin") for i in range(4)])
    for i, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert sha(cons.path(f"cc{i}.bin")) == sha(prod.path(f"cc{i}.bin"))


def producer_killed_mid_transfer(prod, cons, env):
    """The consumer fails within its inactivity deadline (10 s) and leaves
    neither the file nor a temporary file."""
    harness.write_file(prod.path("huge.bin"), 1 << 30, seed=3)
    prod.dyad("produce", prod.path("huge.bin"))
    p = cons.dyad_async("consume", cons.path("huge.bin"), env_extra={**env, "DYAD_TRANSFER_TIMEOUT": 10})
    killed = harness.kill_when_transfer_starts(prod, p, cons.dir, "huge.bin")
    assert killed, "the transfer ended before it could be interrupted"
    t0 = time.monotonic()
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "huge.bin" in err
    assert time.monotonic() - t0 < 12
    assert not os.path.exists(cons.path("huge.bin"))
    assert glob.glob(os.path.join(cons.dir, ".huge.bin.dyad-*")) == []
