"""DYAD_DTL_MODE=AUTO end to end: the transport chosen per file from the
owner's published records (and said by `dyad consume --explain`), LOCAL on
the producer's node, every transport this machine has reached through AUTO,
and the service's memory under many and slow consumers."""
import json
import os
import socket
import struct
import threading
import time

import pytest

import harness

sha = harness.sha256
WAIT = {"DYAD_WAIT_TIMEOUT": 30}


def built():
    cfg = json.loads(harness.subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True,
                                            check=True).stdout)
    return [t["name"] for t in cfg["transports_built"]]


def consume(node, *files, env=None):
    p = node.dyad("--json", "consume", *[node.path(f) for f in files], env_extra={**WAIT, **(env or {})})
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_auto_is_the_default_and_explains_itself(cluster):
    prod, cons = cluster[0], cluster[1]
    harness.write_file(prod.path("big.bin"), 24 << 20, seed=1)
    harness.write_file(prod.path("small.bin"), 3000, seed=2)
    prod.dyad("produce", prod.path("big.bin"), prod.path("small.bin"))
    assert prod.status()["default_mode"] == "AUTO"
    records = prod.status()["transports"]
    assert {r["name"] for r in records} >= {"FLUX_RPC", "LOCAL"}
    assert all({"reach", "latency_us", "bandwidth_gbps", "rma_native", "source"} <= set(r) for r in records)
    p = cons.dyad("consume", "--explain", cons.path("big.bin"), cons.path("small.bin"), env_extra=WAIT)
    out = p.stdout
    # Another node: LOCAL is left out with the reason; every candidate has a line.
    assert "LOCAL@node: left out, needs the consumer on the owner's node" in out, out
    assert "(large)" in out and "(small)" in out, out
    for r in consume(cons, "big.bin"):
        assert r["action"] == "present"
    assert sha(prod.path("big.bin")) == sha(cons.path("big.bin"))
    assert sha(prod.path("small.bin")) == sha(cons.path("small.bin"))
    # The chosen transport is the first eligible candidate, and it is the one
    # that moved the file (the service's counters say so).
    os.unlink(cons.path("big.bin"))
    (r,) = consume(cons, "big.bin")
    sel = r["selection"]
    assert r["transport"] == sel["chosen"]
    first = next(c for c in sel["candidates"] if c["eligible"])
    assert first["name"] == sel["chosen"]
    assert all(c["estimate_us"] >= first["estimate_us"] * 0.99 for c in sel["candidates"] if c["eligible"])
    assert prod.status()["counters"]["per_transport"][sel["chosen"]]["served"] >= 1


def test_same_node_other_directory_uses_local(cluster):
    prod = cluster[0]
    view = harness.NodeView(prod, os.path.join(cluster.root, "node0-other"))
    harness.write_file(prod.path("d/x.bin"), 9 << 20, seed=3)
    harness.write_file(prod.path("d/y.bin"), 2 << 20, seed=4)
    harness.write_file(prod.path("d/small.bin"), 4096, seed=5)
    prod.dyad("produce", prod.path("d/x.bin"), prod.path("d/y.bin"), prod.path("d/small.bin"))
    rs = consume(view, "d/x.bin", "d/y.bin", "d/small.bin")
    # Large files by LOCAL; a small one is cheaper inline in the stream's
    # first answer (one round trip instead of two) on these figures.
    assert [r["transport"] for r in rs] == ["LOCAL", "LOCAL", "FLUX_RPC"], [r["selection"] for r in rs]
    for f in ("x", "y", "small"):
        assert sha(prod.path(f"d/{f}.bin")) == sha(view.path(f"d/{f}.bin"))
    # A copy, not a link: the producer rewriting its file does not touch it.
    assert os.stat(prod.path("d/x.bin")).st_ino != os.stat(view.path("d/x.bin")).st_ino
    local = prod.status()["counters"]["per_transport"]["LOCAL"]
    assert local["served"] == 2 and local["transport"]["bytes_copied_by_consumers"] == 11 << 20
    # The same directory as the producer: nothing moves at all.
    (r,) = consume(prod, "d/x.bin")
    assert r["action"] == "in-place"


@pytest.mark.parametrize("transport", ["FLUX_RPC", "UCX", "MARGO", "LOCAL"])
def test_every_transport_through_auto(transport):
    """Figures that make one transport the best: AUTO must choose it and it
    must move the files intact (0 B, 1 B, 3 MiB + 1)."""
    if transport not in built():
        pytest.skip(f"this build has no {transport} transport")
    figures = {"FLUX_RPC": "FLUX_RPC=1/500", "UCX": "UCX=1/500", "MARGO": "MARGO=1/500", "LOCAL": "LOCAL=1/500"}
    c = harness.Cluster(nodes=2, env={"DYAD_DTL_FIGURES": figures[transport], "UCX_WARN_UNUSED_ENV_VARS": "n"})
    try:
        prod = c[0]
        cons = c[1] if transport != "LOCAL" else harness.NodeView(prod, os.path.join(c.root, "view"))
        sizes = {"zero": 0, "one": 1, "mid": (3 << 20) + 1}
        for n, s in sizes.items():
            harness.write_file(prod.path(n), s, seed=s)
        prod.dyad("produce", *[prod.path(n) for n in sizes])
        rs = consume(cons, *sizes)
        assert [r["transport"] for r in rs] == [transport] * 3, [r["selection"] for r in rs]
        for n in sizes:
            assert sha(prod.path(n)) == sha(cons.path(n)), n
        assert prod.status()["counters"]["per_transport"][transport]["served"] == 3
    finally:
        c.cleanup()


def test_service_offering_only_the_stream(cluster):
    """A dyadd serving FLUX_RPC alone: AUTO consumers use it, the others are
    listed as not offered, and a fixed mode it does not serve is refused."""
    c = harness.Cluster(nodes=2, start=False)
    try:
        c[0].start(["--transports", "FLUX_RPC"])
        c[1].start()
        prod, cons = c[0], c[1]
        harness.write_file(prod.path("f"), 5 << 20, seed=9)
        prod.dyad("produce", prod.path("f"))
        assert [r["name"] for r in prod.status()["transports"]] == ["FLUX_RPC"]
        p = cons.dyad("consume", "--explain", cons.path("f"), env_extra=WAIT)
        assert "via FLUX_RPC" in p.stdout and "LOCAL: left out, not offered" in p.stdout, p.stdout
        assert sha(prod.path("f")) == sha(cons.path("f"))
        harness.write_file(prod.path("g"), 10, seed=1)
        prod.dyad("produce", prod.path("g"))
        p = cons.dyad("consume", cons.path("g"), check=False, env_extra={**WAIT, "DYAD_DTL_MODE": "LOCAL"})
        assert p.returncode != 0 and "not served here" in p.stderr, p.stderr
        assert not os.path.exists(cons.path("g"))
    finally:
        c.cleanup()
    # Bad service settings are refused at start with their name.
    for args, env, word in ((["--transports", "RDMA"], {}, "RDMA"), (["--memory", "lots"], {}, "lots"),
                            (["--memory", "1M"], {}, "16M"), ([], {"DYAD_DTL_FIGURES": "UCX=fast"}, "DYAD_DTL_FIGURES")):
        d = os.path.join(cluster.root, "bad")
        os.makedirs(d, exist_ok=True)
        p = harness.subprocess.run([harness.DYADD, "--listen", "127.0.0.1:0", "--kvs", cluster[0].uri, *args, d],
                                   capture_output=True, text=True, timeout=30, env=dict(os.environ, **env))
        assert p.returncode != 0 and word in p.stderr, (args, p.stderr)


# ---- the service's memory: raw stream consumers ----

HDR = struct.Struct("<IHBBIiII")


class Stream:
    """A minimal FLUX_RPC consumer that reads data into one reused buffer
    (and can be told to read slowly), to load the service from one process."""

    def __init__(self, node, upath):
        self.s = socket.create_connection((node.host, node.port), timeout=120)
        self._send(1, 0, {"version": 1})
        self._frame()
        self._send(2, 1, {"topic": "dyad.fetch", "upath": upath, "transport": "FLUX_RPC"})
        self.buf = bytearray(1 << 20)
        self.bytes = 0
        self.done = False
        self.error = None

    def _send(self, typ, tag, meta):
        m = json.dumps(meta).encode()
        self.s.sendall(HDR.pack(0x44415944, 1, typ, 0, tag, 0, len(m), 0) + m)

    def _exact(self, view):
        got = 0
        while got < len(view):
            n = self.s.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("closed")
            got += n

    def _frame(self, rate=None):
        h = bytearray(HDR.size)
        self._exact(memoryview(h))
        _, _, typ, _, tag, err, ml, dl = HDR.unpack(h)
        meta = bytearray(ml)
        self._exact(memoryview(meta))
        left = dl
        while left:
            n = min(left, len(self.buf) if rate is None else 65536)
            self._exact(memoryview(self.buf)[:n])
            left -= n
            self.bytes += n
            if rate:
                time.sleep(n / rate)
        return typ, err

    def run(self, rate=None, stall_after=None, stall_s=0):
        try:
            stalled = False
            while True:
                if stall_after is not None and not stalled and self.bytes >= stall_after:
                    stalled = True
                    time.sleep(stall_s)
                typ, err = self._frame(rate)
                if typ == 4:
                    self.done = True
                    return
                if typ == 5:
                    self.error = err
                    return
        except OSError as e:
            self.error = e
        finally:
            self.s.close()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as fh:
        f = dict(line.split(":", 1) for line in fh)
    return int(f["VmRSS"].split()[0]), int(f["VmHWM"].split()[0])


UNDER_ASAN = "libasan" in harness.subprocess.run(["ldd", harness.DYADD], capture_output=True, text=True).stdout


@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer's shadow memory and quarantine make RSS meaningless")
def test_32_consumers_of_1gib_stay_within_the_memory_budget():
    budget = 48 << 20
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start(["--memory", "48M"])
        with open(node.path("big.bin"), "wb") as fh:  # sparse: no disk, all page cache
            fh.truncate(1 << 30)
        rss0, _ = rss_kib(node.proc.pid)
        consumers = [Stream(node, "big.bin") for _ in range(32)]
        # Every consumer stalls a while after its first 16 MiB, so all 32
        # transfers are in flight with full pipelines at once (32 x 4 MiB
        # wanted, 48 MiB allowed), then they run to the end.
        threads = [threading.Thread(target=s.run, kwargs={"stall_after": 16 << 20, "stall_s": 2}) for s in consumers]
        for t in threads:
            t.start()
        peak_status = 0
        while any(t.is_alive() for t in threads):
            time.sleep(0.5)
            peak_status = max(peak_status, node.status()["memory"]["in_use"])
        for t in threads:
            t.join()
        assert all(s.done and s.bytes == 1 << 30 for s in consumers), [(s.bytes, s.error) for s in consumers]
        _, hwm = rss_kib(node.proc.pid)
        mem = node.status()["memory"]
        assert mem["limit"] == budget and mem["peak"] <= budget and peak_status <= budget
        assert mem["parked_total"] > 0, "the budget never bound: the test proves nothing"
        grew = (hwm - rss0) * 1024
        print(f"dyadd RSS {rss0 >> 10} MiB at start, peak {hwm >> 10} MiB; budget peak {mem['peak'] >> 20} MiB")
        # The budget, plus a little for connections and bookkeeping.
        assert grew <= budget + (8 << 20), f"dyadd grew by {grew >> 20} MiB with a {budget >> 20} MiB budget"
    finally:
        c.cleanup()


def test_a_slow_consumer_does_not_starve_fast_ones():
    """Four fast consumers alone, then beside one that reads at 1 MB/s: they
    keep at least 80% of their throughput (best of three rounds each,
    alternating, on a shared 2-core machine), and the slow one keeps moving.
    The default budget: the slow one holds only its own pipeline. (Turns
    when the budget binds are unit-tested; the 32-consumer test binds it.)"""
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start()
        with open(node.path("slow.bin"), "wb") as fh:
            fh.truncate(256 << 20)
        for i in range(16):
            with open(node.path(f"fast{i}.bin"), "wb") as fh:
                fh.truncate(128 << 20)

        def fast_round(names):
            streams = [Stream(node, n) for n in names]
            threads = [threading.Thread(target=s.run) for s in streams]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            dt = time.monotonic() - t0
            assert all(s.done for s in streams), [s.error for s in streams]
            return sum(s.bytes for s in streams) / dt

        # Files read once first: the rounds then measure the service, not
        # the allocation of fresh page cache. Alone and beside the slow one
        # alternate, so drift on a shared machine hits both.
        for i in range(16):
            with open(node.path(f"fast{i}.bin"), "rb") as fh:
                while fh.read(1 << 24):
                    pass
        alone, with_slow, slow_bytes = [], [], 0
        for k in (0, 8, 0):
            alone.append(fast_round([f"fast{i}.bin" for i in range(k, k + 4)]))
            slow = Stream(node, "slow.bin")
            st = threading.Thread(target=slow.run, kwargs={"rate": 1e6})
            st.start()
            time.sleep(0.3)
            with_slow.append(fast_round([f"fast{i}.bin" for i in range(k + 4, k + 8)]))
            slow_bytes += slow.bytes
            slow.s.shutdown(socket.SHUT_RDWR)
            st.join()
        alone, with_slow = max(alone), max(with_slow)
        print(f"4 fast consumers: {alone / 1e9:.2f} GB/s alone, {with_slow / 1e9:.2f} GB/s beside a 1 MB/s one")
        assert slow_bytes > 0
        assert with_slow >= 0.8 * alone, f"{with_slow / 1e9:.2f} GB/s vs {alone / 1e9:.2f} alone"
        assert node.status()["memory"]["peak"] <= 5 * (4 << 20)
    finally:
        c.cleanup()
