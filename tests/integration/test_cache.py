# SPDX-License-Identifier: Apache-2.0
"""The bounded node-local cache of consumer copies (DYAD_CACHE_*): usage at
or under the capacity after every consume, LRU and FIFO order, the grace
period, a copy in use or being moved never removed, a producer's own files
never removed. docs/user-guide.md, "Cache and origin"."""
import fcntl
import glob
import json
import os

import pytest

import harness

KIB = 1 << 10
MIB = 1 << 20


def cache_env(capacity, policy="LRU", grace=0, **extra):
    return {"DYAD_CACHE_CAPACITY": capacity, "DYAD_CACHE_POLICY": policy,
            "DYAD_CACHE_GRACE_PERIOD": grace, "DYAD_WAIT_TIMEOUT": 10, **extra}


def consume(node, rel, env):
    p = node.dyad("--json", "consume", node.path(rel), env_extra=env)
    return json.loads(p.stdout.strip().splitlines()[-1])


def copies(node, names):
    """Which of `names` are in node's directory, and their bytes together."""
    there = [n for n in names if os.path.exists(node.path(n))]
    return there, sum(os.path.getsize(node.path(n)) for n in there)


def state(node):
    """The cache's counters (.dyad/cache/state: dyad-cache 1 BYTES FILES HITS
    MISSES EVICTIONS EVICTED_BYTES)."""
    words = open(os.path.join(node.dir, ".dyad", "cache", "state")).read().split()
    keys = ["bytes", "files", "hits", "misses", "evictions", "evicted_bytes"]
    return dict(zip(keys, map(int, words[2:])))


def produce_many(node, prefix, count, size):
    names = [f"{prefix}/f{i:03d}.bin" for i in range(count)]
    for i, n in enumerate(names):
        harness.write_file(node.path(n), size, seed=i)
    node.dyad("produce", *[node.path(n) for n in names])
    return names


def test_usage_stays_at_or_under_capacity(cluster):
    n0, n1 = cluster[0], cluster[1]
    names = produce_many(n0, "cap", 24, 256 * KIB)
    env = cache_env("2M")
    for n in names:
        consume(n1, n, env)
        _, used = copies(n1, names)
        assert used <= 2 * MIB, (n, used)
    there, _ = copies(n1, names)
    assert names[-1] in there and len(there) < len(names)
    st = state(n1)
    assert st["misses"] == 24 and st["evictions"] == 24 - len(there), st
    # Consumes of evicted files fetch them again; of kept ones, hits.
    assert consume(n1, names[-1], env)["action"] == "present"
    assert consume(n1, names[0], env)["action"] == "fetched"
    assert state(n1)["hits"] == 1
    # `dyad config` shows the same counters (--json: "cache").
    shown = json.loads(n1.dyad("--json", "config", env_extra=env).stdout)["cache"]
    assert shown == state(n1), shown
    text = n1.dyad("config", env_extra=env).stdout
    assert "cache: " in text and "hits 1" in text, text


@pytest.mark.parametrize("policy", ["LRU", "FIFO"])
def test_lru_and_fifo_order(cluster, policy):
    n0, n1 = cluster[0], cluster[1]
    f = produce_many(n0, policy, 5, 256 * KIB)
    # Capacity 1 MiB: f0-f3 fill it; f0 consumed again (a hit); f4 passes it
    # and two copies go (1.25 MiB down to the 0.8 MiB watermark).
    env = cache_env("1M", policy)
    for n in f[:4]:
        consume(n1, n, env)
    assert consume(n1, f[0], env)["action"] == "present"
    consume(n1, f[4], env)
    there, used = copies(n1, f)
    gone = sorted(set(f) - set(there))
    if policy == "LRU":  # least recently consumed: f1, f2 (f0 was consumed again)
        assert gone == [f[1], f[2]], there
    else:  # oldest installed: f0, f1
        assert gone == [f[0], f[1]], there
    assert used <= 0.8 * MIB


def test_the_grace_period_is_honoured(cluster):
    n0, n1 = cluster[0], cluster[1]
    f = produce_many(n0, "grace", 6, 256 * KIB)
    # A grace period longer than the test: nothing may go, the cache goes
    # over its capacity (and says so), every consume still succeeds.
    for n in f:
        consume(n1, n, cache_env("512K", grace=3600))
    there, used = copies(n1, f)
    assert there == f and used > 512 * KIB
    # The same copies, outside a grace period of 0 s: evicted at the next
    # consume that finds the cache over its capacity.
    g = produce_many(n0, "grace2", 1, 64 * KIB)
    consume(n1, g[0], cache_env("512K", grace=0))
    there, used = copies(n1, f + g)
    assert used <= 512 * KIB and g[0] in there


def the_only_lock_file(node):
    locks = glob.glob(os.path.join(node.dir, ".dyad", "locks", "*.lock"))
    assert len(locks) == 1, locks
    return locks[0]


def test_a_copy_being_consumed_or_open_is_never_removed(cluster):
    n0, n1 = cluster[0], cluster[1]
    f = produce_many(n0, "busy", 8, 256 * KIB)
    env = cache_env("1M")
    # f0 first, alone: the only per-file lock file is f0's. Held here, as a
    # consume of f0 in flight in another process holds it.
    consume(n1, f[0], env)
    lock = open(the_only_lock_file(n1), "r+")
    fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    # f1 held open, as a reader (the wrapper's descriptor) does.
    consume(n1, f[1], env)
    reader = open(n1.path(f[1]), "rb")
    try:
        for n in f[2:]:
            # A file sharing f0's lock stripe waits for it: then skipped.
            n1.dyad("consume", n1.path(n), check=False, env_extra={**env, "DYAD_WAIT_TIMEOUT": 1})
        there, used = copies(n1, f)
        # f0 and f1, the least recently consumed, stayed; others went.
        assert f[0] in there and f[1] in there, there
        assert len(there) < len(f)
    finally:
        reader.close()
        fcntl.lockf(lock, fcntl.LOCK_UN)
        lock.close()
    # Released and closed: the next consume over capacity removes them
    # (which proves the two above were kept for a reason).
    g = produce_many(n0, "busy2", 2, 256 * KIB)
    for n in g:
        consume(n1, n, env)
    there, _ = copies(n1, f)
    assert f[0] not in there and f[1] not in there, there


def test_a_producers_own_files_are_never_removed(cluster):
    n0, n1 = cluster[0], cluster[1]
    # node1 produces into its directory, which is also its consumer directory.
    own = produce_many(n1, "mine", 4, 256 * KIB)
    theirs = produce_many(n0, "theirs", 8, 256 * KIB)
    env = cache_env("1M")
    for n in theirs[:2]:
        consume(n1, n, env)
    # A consumed copy that node1 then publishes as its own (pydyad's r+):
    # no longer a cache copy.
    with open(n1.path(theirs[0]), "r+b") as fh:
        fh.write(b"changed by node1")
    n1.dyad("produce", n1.path(theirs[0]))
    for n in own:  # in place: nothing moves, nothing is recorded
        assert consume(n1, n, env)["action"] == "in-place"
    for n in theirs[2:]:
        consume(n1, n, env)
    assert copies(n1, own)[0] == own
    assert os.path.exists(n1.path(theirs[0]))
    there, _ = copies(n1, theirs[1:])
    assert len(there) < len(theirs) - 1
    # Its record still leads to it: node0 fetches node1's version.
    r = json.loads(n0.dyad("--json", "consume", n0.path(theirs[0])).stdout.strip().splitlines()[-1])
    assert r["action"] == "fetched"
    assert open(n0.path(theirs[0]), "rb").read(16) == b"changed by node1"


def test_bad_cache_settings_are_clear_errors(cluster):
    n1 = cluster[1]
    p = n1.dyad("consume", n1.path("x"), check=False, env_extra={"DYAD_CACHE_POLICY": "LFU", "DYAD_WAIT_TIMEOUT": 2})
    assert p.returncode != 0 and "DYAD_CACHE_POLICY" in p.stderr and "LRU" in p.stderr, p.stderr
    p = n1.dyad("consume", n1.path("x"), check=False, env_extra={"DYAD_CACHE_LOW_WATERMARK": "1.5", "DYAD_WAIT_TIMEOUT": 2})
    assert p.returncode != 0 and "DYAD_CACHE_LOW_WATERMARK" in p.stderr, p.stderr
    c = json.loads(n1.dyad("--json", "config", env_extra={"DYAD_CACHE_CAPACITY": "4M"}).stdout)
    text = json.dumps(c)
    assert "DYAD_CACHE_CAPACITY" in text and "DYAD_PATH_ORIGIN" in text
