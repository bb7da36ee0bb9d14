# SPDX-License-Identifier: Apache-2.0
"""Read-through that spares the shared file system (issue 49, item 4;
docs/user-guide.md, "Each origin file read once" and "Byte ranges of origin
files"): with DYAD_ORIGIN_PUBLISH, of the nodes that want an origin file at
once one reads it from the origin and the others fetch it from that node; a
claim whose holder is gone does not block the others; and a second range
read of a block of an origin file does not touch the origin.

The origin is a plain directory; its reads are counted with inotify
(IN_OPEN, IN_ACCESS) on the files themselves."""
import ctypes
import glob
import json
import ctypes.util
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time

import pytest

import harness
import rawwire

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IN_ACCESS, IN_OPEN = 0x1, 0x20


class Watch:
    """inotify on some files: counts of IN_OPEN and IN_ACCESS per file."""

    def __init__(self, paths):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.names = {}
        for p in paths:
            wd = self.libc.inotify_add_watch(self.fd, p.encode(), IN_OPEN | IN_ACCESS)
            assert wd >= 0, os.strerror(ctypes.get_errno())
            self.names[wd] = p
        self.opens = {p: 0 for p in paths}
        self.reads = {p: 0 for p in paths}

    def drain(self):
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return self
            i = 0
            while i < len(buf):
                wd, mask, _, n = struct.unpack_from("iIII", buf, i)
                i += 16 + n
                p = self.names.get(wd)
                if p and mask & IN_OPEN:
                    self.opens[p] += 1
                if p and mask & IN_ACCESS:
                    self.reads[p] += 1

    def close(self):
        os.close(self.fd)


def origin_env(origin, **extra):
    return {"DYAD_PATH_ORIGIN": origin, "DYAD_ORIGIN_PUBLISH": 1, "DYAD_WAIT_TIMEOUT": 30, **extra}


@pytest.fixture(params=["embedded", "etcd"])
def three(request):
    """Three nodes, the metadata in node0's dyadd or in an etcd (whose
    first-writer rule holds the claims too)."""
    if request.param == "etcd" and not shutil.which("etcd"):
        pytest.skip("etcd is not installed (scripts/install-deps.sh)")
    c = harness.Cluster(nodes=3, store=request.param)
    yield c
    c.cleanup()


def test_each_origin_file_is_read_once_by_three_nodes(three):
    """Three nodes consume the same origin files at the same moment: each
    file is opened in the origin once in all; the other two nodes fetch it
    from the node that read it."""
    cluster3 = three
    origin = os.path.join(cluster3.root, "origin")
    files = [f"ds/s{i}.bin" for i in range(3)]
    for i, rel in enumerate(files):
        harness.write_file(os.path.join(origin, rel), 16 << 20, seed=10 + i)
    want = {rel: harness.sha256(os.path.join(origin, rel)) for rel in files}
    watch = Watch([os.path.join(origin, rel) for rel in files])
    try:
        for rel in files:
            procs = [n.dyad_async("--json", "consume", n.path(rel), env_extra=origin_env(origin))
                     for n in cluster3.nodes]
            outs = [p.communicate(timeout=120) for p in procs]
            for p, (out, err) in zip(procs, outs):
                assert p.returncode == 0, err
            actions = sorted(json.loads(out.strip().splitlines()[-1])["action"] for out, _ in outs)
            assert actions == ["fetched", "fetched", "origin"], actions
            for n in cluster3.nodes:
                assert harness.sha256(n.path(rel)) == want[rel]
        watch.drain()
        assert all(v == 1 for v in watch.opens.values()), watch.opens
    finally:
        watch.close()


def claim(node, rel, **args):
    r = rawwire.Raw.to(node)
    try:
        f, _ = r.collect(r.request("dyad.origin_claim", upath=rel, **args))
    finally:
        r.close()
    assert f["type"] == rawwire.END, f
    return f["meta"]


def test_a_claim_whose_holder_is_gone_does_not_block(cluster3):
    """A claim held by a node whose service stopped is taken over at once; one
    held by a live node that never publishes is taken over after
    DYAD_TRANSFER_TIMEOUT. Either way the file is read from the origin and
    published by the taker."""
    n0, n1, n2 = cluster3.nodes
    origin = os.path.join(cluster3.root, "origin")
    harness.write_file(os.path.join(origin, "gone.bin"), 1 << 20, seed=5)
    harness.write_file(os.path.join(origin, "slow.bin"), 1 << 20, seed=6)
    a = claim(n2, "gone.bin")
    assert a["held"] is True, a
    assert claim(n1, "gone.bin")["held"] is False  # another node's claim stands
    n2.stop()
    t0 = time.monotonic()
    p = n1.dyad("--json", "consume", n1.path("gone.bin"), env_extra=origin_env(origin))
    assert time.monotonic() - t0 < 20, "waited for a holder that is gone"
    assert '"origin"' in p.stdout, p.stdout
    assert harness.sha256(n1.path("gone.bin")) == harness.sha256(os.path.join(origin, "gone.bin"))
    # A live holder that never publishes: its claim lasts DYAD_TRANSFER_TIMEOUT.
    assert claim(n0, "slow.bin")["held"] is True
    t0 = time.monotonic()
    p = n1.dyad("--json", "consume", n1.path("slow.bin"),
                env_extra=origin_env(origin, DYAD_TRANSFER_TIMEOUT=2))
    waited = time.monotonic() - t0
    assert 1.5 < waited < 20, waited
    assert harness.sha256(n1.path("slow.bin")) == harness.sha256(os.path.join(origin, "slow.bin"))


def range_reader(node, origin, rel, ranges):
    """A process of `node` reading byte ranges of `rel` with pydyad's
    consume_range (DYAD_PATH_ORIGIN set), one after the other; prints each
    range's bytes' length and the SHA-256."""
    code = textwrap.dedent(f"""
        import hashlib, sys
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        for off, n in {ranges!r}:
            b = d.consume_range({node.path(rel)!r}, off, n)
            print(len(b), hashlib.sha256(b).hexdigest(), flush=True)
    """)
    env = node.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"),
                   DYAD_PATH_ORIGIN=origin, DYAD_WAIT_TIMEOUT=10)
    p = subprocess.run(node.prefix + [sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def expected(src, ranges):
    import hashlib
    out = []
    with open(src, "rb") as f:
        for off, n in ranges:
            f.seek(off)
            b = f.read(n)
            out += [str(len(b)), hashlib.sha256(b).hexdigest()]
    return out


def test_a_second_range_read_of_a_block_does_not_touch_the_origin(cluster):
    n1 = cluster[1]
    origin = os.path.join(cluster.root, "origin")
    src = os.path.join(origin, "set/big.bin")
    harness.write_file(src, 5 << 20, seed=7)
    watch = Watch([src])

    def origin_reads(ranges):
        """Reads `ranges` through DYAD (checked against the origin's bytes):
        the opens and reads of the origin file it made."""
        want = expected(src, ranges)
        watch.drain()
        before = (watch.opens[src], watch.reads[src])
        assert range_reader(n1, origin, "set/big.bin", ranges) == want
        watch.drain()
        return watch.opens[src] - before[0], watch.reads[src] - before[1]

    try:
        # Block 0; the end of block 1 and the start of block 2.
        opens, reads = origin_reads([(1000, 70000), ((2 << 20) - 10, 20)])
        assert opens >= 1 and reads >= 1, (opens, reads)
        # Other ranges of the same blocks, by another process: nothing of the origin read.
        again = [(0, 4096), ((1 << 20) + 5, 900000), ((2 << 20), 1 << 20)]
        assert origin_reads(again) == (0, 0), "the origin was read again"
        # A block not held yet is read from the origin; a changed origin file is read again.
        assert origin_reads([(4 << 20, 100)])[0] >= 1
        harness.write_file(src, 5 << 20, seed=8)
        assert origin_reads(again)[0] >= 1
        assert origin_reads(again) == (0, 0)
    finally:
        watch.close()
    # Never a partial block file visible as the user's: all under .dyad.
    assert not os.path.exists(n1.path("set/big.bin"))


class RangeProcess:
    """One process of `node` reading byte ranges with pydyad's
    consume_range (DYAD_PATH_ORIGIN set) as the test asks: read() sends
    "PATH OFFSET LENGTH" and gets the bytes' length and SHA-256."""

    CODE = textwrap.dedent("""
        import hashlib, sys
        sys.path.insert(0, sys.argv[1])
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        for line in sys.stdin:
            path, off, n = line.split()
            b = d.consume_range(path, int(off), int(n))
            print(len(b), hashlib.sha256(b).hexdigest(), flush=True)
    """)

    def __init__(self, node, origin, **env):
        self.node = node
        e = node.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"),
                     DYAD_PATH_ORIGIN=origin, DYAD_WAIT_TIMEOUT=10, **env)
        self.p = subprocess.Popen(node.prefix + [sys.executable, "-c", self.CODE, os.path.join(ROOT, "python")],
                                  env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)

    def read(self, rel, off, n):
        self.p.stdin.write(f"{self.node.path(rel)} {off} {n}\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"the range reader ended: {self.p.stderr.read()}")
        return line.split()

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=30) == 0, self.p.stderr.read()


def service_requests(cluster):
    """Requests the cluster's services answered, of every kind but status."""
    total = 0
    for n in cluster.nodes:
        kinds = n.status()["counters"]["per_kind"]
        total += sum(v["requests"] for k, v in kinds.items() if k != "status")
    return total


def test_within_the_recheck_time_a_range_read_asks_no_one(cluster):
    """DYAD_ORIGIN_RECHECK: within it, a process's range reads of blocks it
    holds ask no service and neither open nor read the origin file; after
    it, an origin file changed and a record published meanwhile are seen.
    A block not held of a file changed within it is read from its new
    state at once; DYAD_ORIGIN_RECHECK=0 asks at every range."""
    n0, n1 = cluster.nodes
    origin = os.path.join(cluster.root, "origin")
    a, b = "set/a.bin", "set/b.bin"
    for rel in (a, b):
        harness.write_file(os.path.join(origin, rel), 3 << 20)
    recheck = 4.0
    watch = Watch([os.path.join(origin, a), os.path.join(origin, b)])
    reader = RangeProcess(n1, origin, DYAD_ORIGIN_RECHECK=recheck)
    ranges = [(0, 4096), (70000, 300000), ((1 << 20) - 10, 20)]
    try:
        t0 = time.monotonic()
        for rel in (a, b):  # learnt, and blocks 0 and 1 held
            assert reader.read(rel, 0, 2 << 20) == expected(os.path.join(origin, rel), [(0, 2 << 20)])
        learnt = time.monotonic()
        want = {rel: [expected(os.path.join(origin, rel), [r]) for r in ranges] for rel in (a, b)}
        asked = service_requests(cluster)
        watch.drain()
        opened = dict(watch.opens), dict(watch.reads)
        for rel in (a, b):
            for (off, n), w in zip(ranges, want[rel]):
                assert reader.read(rel, off, n) == w
        assert service_requests(cluster) == asked, "a range read within the recheck time asked a service"
        watch.drain()
        assert (watch.opens, watch.reads) == opened, "a range read within the recheck time touched the origin"
        # A held chunk written over is not used: its block is read from the origin again.
        for data in glob.glob(n1.path(".dyad/origin-blocks/*/*.data")):
            with open(data, "r+b") as f:
                f.write(b"\0written over")
        assert reader.read(a, *ranges[0]) == want[a][0]
        watch.drain()
        assert watch.opens[os.path.join(origin, a)] > opened[0][os.path.join(origin, a)]
        # Meanwhile the origin's a changes: its blocks held are what was
        # learnt until the recheck; one not held is read from the new file.
        harness.write_file(os.path.join(origin, a), 3 << 20)
        assert reader.read(a, *ranges[0]) == want[a][0]
        assert reader.read(a, (2 << 20) + 5, 100) == expected(os.path.join(origin, a), [((2 << 20) + 5, 100)])
        assert time.monotonic() - t0 < recheck, "too slow to stay within the recheck time"
        # And b is produced: seen after the recheck time.
        produced = n0.path(b)
        harness.write_file(produced, 1 << 20)
        n0.dyad("produce", produced)
        time.sleep(max(0.0, learnt + recheck + 0.3 - time.monotonic()))
        assert reader.read(a, 70000, 1000) == expected(os.path.join(origin, a), [(70000, 1000)])
        assert reader.read(b, 100, 1000) == expected(produced, [(100, 1000)])
        assert service_requests(cluster) > asked
        reader.close()
        every = RangeProcess(n1, origin, DYAD_ORIGIN_RECHECK=0)
        reader = every
        for _ in range(2):
            asked = service_requests(cluster)
            assert every.read(a, 0, 4096) == expected(os.path.join(origin, a), [(0, 4096)])
            assert service_requests(cluster) > asked
        every.close()
    finally:
        if reader.p.poll() is None:
            reader.p.kill()
        watch.close()
