# SPDX-License-Identifier: Apache-2.0
"""dyad_consume_range (upstream DYAD's 2026 byte-range consume): the bytes
[offset, offset + length) of a produced file in memory, no local file, over
every transport, from a producer on another node and on the same node; a
file already on the node is read in place (nothing fetched); a range past
the end is DYAD_RC_BADFIO; an empty range is an empty buffer; a file
produced again between calls gives its newest bytes. The driver is
tests/compat/range.c, written against upstream's 2026 header only."""
import os
import random
import subprocess

import pytest

import harness
from test_compat import build

GIB, MIB = 1 << 30, 1 << 20
BADFIO = -1002
BUILT = harness.built_transports()
WAIT = {"DYAD_WAIT_TIMEOUT": 60, "DYAD_TRANSFER_TIMEOUT": 30}


def fnv(b):
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    return build(str(tmp_path_factory.mktemp("range")), "range", "range.c", ["dyad_client", "dyad_ctx"])


@pytest.fixture(scope="module")
def rcluster():
    c = harness.Cluster(nodes=2, env={"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"})
    yield c
    c.cleanup()


def sparse_gib(path, seed):
    """1 GiB, sparse (fast to make, fast to read): random bytes at its start,
    1 MiB in its middle and at its end."""
    rnd = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(GIB)
        for at, n in [(0, 4096), (GIB // 2, MIB), (GIB - 4096, 4096)]:
            f.seek(at)
            f.write(rnd.randbytes(n))


def ranges(node, prog, path, specs, **env):
    """Runs the driver on `node`: {(offset, length): (rc, len, fnv, null)}."""
    p = subprocess.run(node.prefix + [prog, path] + [f"{o}:{n}" for o, n in specs],
                       env=node.env(**{**WAIT, **env}), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    lines = out.splitlines()
    assert lines[0] == "cache mode=2 capacity=67108864 watermark=0.50 grace=7 origin=(null)", lines[0]
    res = {}
    for line in lines[1:]:
        off, n, rc, got, h, null = line.split()
        res[(int(off), int(n))] = (int(rc[3:]), int(got[4:]), h[4:], null == "null=1")
    return res


def expect(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return fnv(f.read(n))


def check(res, src):
    """The outcomes every transport must give (SPECS)."""
    for (off, n), (rc, got, h, null) in res.items():
        if off + n > GIB:
            assert (rc, got, null) == (BADFIO, 0, True), (off, n)  # past the end: an error, no bytes
        else:
            assert (rc, got, null) == (0, n, False), (off, n)
            assert h == expect(src, off, n), (off, n)


SPECS = [(0, 1), (GIB - 1, 1), (GIB // 2 - 100, MIB), (0, 0), (GIB, 0), (GIB - 1, 2), (GIB + 5, 0),
         (GIB - 4096, 4096)]


@pytest.mark.parametrize("mode", ["FLUX_RPC", "UCX", "MARGO", "AUTO"])
def test_ranges_from_another_node(rcluster, prog, mode):
    if mode not in BUILT + ["AUTO"]:
        pytest.skip(f"this build has no {mode} transport")
    prod, cons = rcluster[0], rcluster[1]
    rel = f"r/{mode}.bin"
    sparse_gib(prod.path(rel), seed=len(mode))
    prod.dyad("produce", prod.path(rel))
    before = prod.status()["counters"]["per_transport"]
    res = ranges(cons, prog, cons.path(rel), SPECS, DYAD_DTL_MODE=mode)
    check(res, prod.path(rel))
    # Only the ranges travelled, and no file was written here.
    after = prod.status()["counters"]["per_transport"]
    sent = sum(a["bytes_sent"] for a in after.values()) - sum(b.get("bytes_sent", 0) for b in before.values())
    assert sent == 1 + 1 + MIB + 4096, sent
    if mode != "AUTO":
        assert after[mode]["served"] - before.get(mode, {}).get("served", 0) == 4
    assert not os.path.exists(cons.path(rel))


@pytest.mark.parametrize("mode", ["LOCAL", "FLUX_RPC", "UCX", "MARGO"])
def test_ranges_from_the_same_node_other_directory(rcluster, prog, mode):
    """A consumer directory of its own on the producer's node: LOCAL passes
    the open file (the range read from its offset), the others move it."""
    if mode not in BUILT:
        pytest.skip(f"this build has no {mode} transport")
    prod = rcluster[0]
    view = harness.NodeView(prod, os.path.join(rcluster.root, f"node0-view-{mode}"))
    rel = f"r/same-{mode}.bin"
    sparse_gib(prod.path(rel), seed=7)
    prod.dyad("produce", prod.path(rel))
    before = prod.status()["counters"]["per_transport"].get(mode, {}).get("served", 0)
    res = ranges(view, prog, view.path(rel), SPECS, DYAD_DTL_MODE=mode, DYAD_SERVICE_URI=prod.unix_uri)
    check(res, prod.path(rel))
    assert prod.status()["counters"]["per_transport"][mode]["served"] - before == 4
    assert not os.path.exists(view.path(rel))


def test_a_file_on_this_node_is_read_in_place(rcluster, prog):
    """The producer's own directory, and a copy consumed here before: pread,
    nothing served."""
    prod, cons = rcluster[0], rcluster[1]
    rel = "r/here.bin"
    sparse_gib(prod.path(rel), seed=11)
    prod.dyad("produce", prod.path(rel))
    served = lambda: sum(t["served"] for t in prod.status()["counters"]["per_transport"].values())  # noqa: E731
    s0 = served()
    check(ranges(prod, prog, prod.path(rel), SPECS), prod.path(rel))
    assert served() == s0
    small = "r/copied.bin"
    harness.write_file(prod.path(small), 3 * MIB, seed=5)
    prod.dyad("produce", prod.path(small))
    cons.dyad("consume", cons.path(small), env_extra=WAIT)
    s1 = served()
    res = ranges(cons, prog, cons.path(small), [(0, 1), (3 * MIB - 1, 1), (MIB, MIB), (3 * MIB, 1)])
    assert served() == s1  # the copy consumed here: no transfer
    for (off, n), (rc, got, h, _) in res.items():
        if off + n > 3 * MIB:
            assert rc == BADFIO
        else:
            assert (rc, got, h) == (0, n, expect(prod.path(small), off, n))


@pytest.mark.parametrize("copy_first", [False, True])
def test_a_file_produced_again_gives_its_newest_bytes(rcluster, prog, copy_first):
    prod, cons = rcluster[0], rcluster[1]
    rel = f"r/again{int(copy_first)}.bin"
    harness.write_file(prod.path(rel), 2 * MIB, seed=1)
    prod.dyad("produce", prod.path(rel))
    if copy_first:  # a copy of the first produce on the consumer's node
        cons.dyad("consume", cons.path(rel), env_extra=WAIT)
    first = ranges(cons, prog, cons.path(rel), [(MIB, 4096)])[(MIB, 4096)]
    assert first[:3] == (0, 4096, expect(prod.path(rel), MIB, 4096))
    harness.write_file(prod.path(rel), 2 * MIB, seed=2)
    prod.dyad("produce", prod.path(rel))
    second = ranges(cons, prog, cons.path(rel), [(MIB, 4096)])[(MIB, 4096)]
    assert second[:3] == (0, 4096, expect(prod.path(rel), MIB, 4096))
    assert second[2] != first[2]


def test_an_overflowing_range_is_named_so(rcluster):
    """Issue 45, finding 7: offset + length past 2^64-1 was refused as
    "'offset' and 'length' must both be unsigned integers", which they were.
    The service names the overflow."""
    from rawwire import ERROR, Raw
    node = rcluster[0]
    harness.write_file(node.path("over.bin"), 100)
    node.dyad("produce", node.path("over.bin"))
    r = Raw.to(node)
    try:
        f, _ = r.collect(r.request("dyad.fetch", upath="over.bin", transport="FLUX_RPC", offset=2**64 - 1,
                                   length=2))
    finally:
        r.close()
    assert f["type"] == ERROR and f["errnum"] == 22, f
    msg = f["meta"]["msg"]
    assert "offset 18446744073709551615 + length 2 overflows" in msg and "unsigned integers" not in msg, msg
