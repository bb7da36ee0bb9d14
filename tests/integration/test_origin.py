# SPDX-License-Identifier: Apache-2.0
"""Read-through from an origin directory (DYAD_PATH_ORIGIN): a consume of a
path nobody produced copies it from the origin instead of waiting; a
produced file wins; a changed origin file is read again; with
DYAD_ORIGIN_PUBLISH another node fetches it from the node that read it.
docs/user-guide.md, "Cache and origin"."""
import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest

import harness

sha = harness.sha256
WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def origin(cluster):
    d = os.path.join(cluster.root, "origin")
    os.makedirs(d)
    return d


def consume(node, rel, **env):
    """`dyad --json consume` of one file: its JSON line."""
    p = node.dyad("--json", "consume", node.path(rel), env_extra={"DYAD_WAIT_TIMEOUT": 10, **env})
    return json.loads(p.stdout.strip().splitlines()[-1])


def no_temporaries(directory):
    left = [p for p in glob.glob(os.path.join(directory, "**", ".*dyad-*"), recursive=True)]
    assert left == [], left


def test_a_file_only_in_the_origin_is_read_through(cluster, origin):
    n1 = cluster[1]
    harness.write_file(os.path.join(origin, "set/a.bin"), 3 << 20, seed=1)
    r = consume(n1, "set/a.bin", DYAD_PATH_ORIGIN=origin)
    assert r["action"] == "origin" and r["transport"] == "origin", r
    assert sha(n1.path("set/a.bin")) == sha(os.path.join(origin, "set/a.bin"))
    no_temporaries(n1.dir)
    # Unchanged: present, nothing read again.
    assert consume(n1, "set/a.bin", DYAD_PATH_ORIGIN=origin)["action"] == "present"
    # Every entry point shares the consume: the LD_PRELOAD wrapper's open.
    harness.write_file(os.path.join(origin, "set/w.bin"), 1 << 16, seed=2)
    env = n1.env(**harness.preload_env(WRAPPER), DYAD_PATH_ORIGIN=origin, DYAD_WAIT_TIMEOUT=10)
    p = subprocess.run(["cat", n1.path("set/w.bin")], env=env, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == open(os.path.join(origin, "set/w.bin"), "rb").read()
    # pydyad (the C API's dyad_consume).
    harness.write_file(os.path.join(origin, "set/p.bin"), 1 << 16, seed=3)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        d.consume({n1.path('set/p.bin')!r})
    """)
    env = n1.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"), DYAD_PATH_ORIGIN=origin,
                 DYAD_WAIT_TIMEOUT=10)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert sha(n1.path("set/p.bin")) == sha(os.path.join(origin, "set/p.bin"))


def test_a_produced_file_wins_over_the_origin(cluster, origin):
    n0, n1 = cluster[0], cluster[1]
    n0.produce_text("both.txt", "produced\n")
    with open(os.path.join(origin, "both.txt"), "w") as f:
        f.write("from the origin\n")
    r = consume(n1, "both.txt", DYAD_PATH_ORIGIN=origin)
    assert r["action"] == "fetched", r
    assert open(n1.path("both.txt")).read() == "produced\n"
    # Read through while nobody had produced it, then produced: from then
    # on the produce wins.
    with open(os.path.join(origin, "later.txt"), "w") as f:
        f.write("from the origin\n")
    assert consume(n1, "later.txt", DYAD_PATH_ORIGIN=origin)["action"] == "origin"
    n0.produce_text("later.txt", "produced later\n")
    r = consume(n1, "later.txt", DYAD_PATH_ORIGIN=origin)
    assert r["action"] == "fetched", r
    assert open(n1.path("later.txt")).read() == "produced later\n"


def test_a_changed_origin_file_is_read_again(cluster, origin):
    n1 = cluster[1]
    src = os.path.join(origin, "c.txt")
    with open(src, "w") as f:
        f.write("version 1\n")
    assert consume(n1, "c.txt", DYAD_PATH_ORIGIN=origin)["action"] == "origin"
    assert open(n1.path("c.txt")).read() == "version 1\n"
    with open(src, "w") as f:  # same size, new bytes
        f.write("version 2\n")
    assert consume(n1, "c.txt", DYAD_PATH_ORIGIN=origin)["action"] == "origin"
    assert open(n1.path("c.txt")).read() == "version 2\n"
    assert consume(n1, "c.txt", DYAD_PATH_ORIGIN=origin)["action"] == "present"


def test_a_missing_origin_is_a_clear_error(cluster, origin):
    n0, n1 = cluster[0], cluster[1]
    gone = os.path.join(cluster.root, "not-mounted")
    p = n1.dyad("consume", n1.path("x.bin"), check=False,
                env_extra={"DYAD_PATH_ORIGIN": gone, "DYAD_WAIT_TIMEOUT": 30})
    assert p.returncode != 0
    assert "DYAD_PATH_ORIGIN" in p.stderr and gone in p.stderr, p.stderr
    assert not os.path.exists(n1.path("x.bin"))
    # A produced file needs no origin: its record is found first.
    n0.produce_text("made.txt", "made\n")
    assert consume(n1, "made.txt", DYAD_PATH_ORIGIN=gone)["action"] == "fetched"
    # Not in an existing origin either: waited for as any produce.
    p = n1.dyad("consume", n1.path("never.bin"), check=False,
                env_extra={"DYAD_PATH_ORIGIN": origin, "DYAD_WAIT_TIMEOUT": 1})
    assert p.returncode != 0 and "DYAD_WAIT_TIMEOUT" in p.stderr, p.stderr


def test_a_second_node_reads_from_the_peer_that_read_through(origin, cluster):
    n0, n1 = cluster[0], cluster[1]
    src = os.path.join(origin, "ds/s0.bin")
    harness.write_file(src, 2 << 20, seed=3)
    r = consume(n0, "ds/s0.bin", DYAD_PATH_ORIGIN=origin, DYAD_ORIGIN_PUBLISH=1)
    assert r["action"] == "origin", r
    # node1 finds node0's record: from the peer, not from the origin (it has
    # the origin set too, and the record wins).
    r = consume(n1, "ds/s0.bin", DYAD_PATH_ORIGIN=origin)
    assert r["action"] == "fetched" and r["endpoint"] == n0.uri, r
    assert sha(n1.path("ds/s0.bin")) == sha(src)
    # Changed in the origin: node0's next consume reads it again and
    # publishes it again; node1's next consume fetches that generation.
    harness.write_file(src, 2 << 20, seed=4)
    assert consume(n0, "ds/s0.bin", DYAD_PATH_ORIGIN=origin, DYAD_ORIGIN_PUBLISH=1)["action"] == "origin"
    r = consume(n1, "ds/s0.bin")
    assert r["action"] == "fetched" and r["endpoint"] == n0.uri, r
    assert sha(n1.path("ds/s0.bin")) == sha(src)
    no_temporaries(n0.dir)
    no_temporaries(n1.dir)


def test_origin_publish_needs_a_producer_directory(cluster, origin):
    n1 = cluster[1]
    p = n1.dyad("consume", n1.path("y"), check=False,
                env_extra={"producer": False, "DYAD_PATH_ORIGIN": origin, "DYAD_ORIGIN_PUBLISH": 1,
                           "DYAD_WAIT_TIMEOUT": 5})
    assert p.returncode != 0 and "DYAD_PATH_PRODUCER" in p.stderr, p.stderr


def test_a_byte_range_of_an_origin_file(cluster, origin):
    """dyad_consume_range (pydyad's consume_range) of a path only in the
    origin: the bytes of the origin file, not a wait for a produce."""
    n1 = cluster[1]
    src = os.path.join(origin, "set/r.bin")
    harness.write_file(src, 2 << 20, seed=4)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        sys.stdout.buffer.write(d.consume_range({n1.path('set/r.bin')!r}, 1000, 70000))
    """)
    env = n1.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"), DYAD_PATH_ORIGIN=origin,
                 DYAD_WAIT_TIMEOUT=10)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    with open(src, "rb") as f:
        f.seek(1000)
        assert p.stdout == f.read(70000)
