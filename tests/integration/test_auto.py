# SPDX-License-Identifier: Apache-2.0
"""DYAD_DTL_MODE=AUTO end to end: the transport chosen per file from the
owner's published records (and said by `dyad consume --explain`), LOCAL on
the producer's node, every transport this machine has reached through AUTO,
and the service's memory under many and slow consumers."""
import errno
import fcntl
import json
import os
import pwd
import shutil
import socket
import subprocess
import threading
import time

import pytest

import harness
from rawwire import END, ERROR, RESPONSE, UPDATE, Raw, Stream

sha = harness.sha256
WAIT = {"DYAD_WAIT_TIMEOUT": 30}


def built():
    return harness.built_transports()


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


def test_local_hands_over_the_open_file_never_its_path(cluster):
    """LOCAL's answer is {"size", "transport"} with the service's open file
    passed over its Unix socket (SCM_RIGHTS): no path, device or inode. Over
    TCP nothing can pass: the service refuses at once with EOPNOTSUPP."""
    prod = cluster[0]
    size = (3 << 20) + 5
    harness.write_file(prod.path("p/f.bin"), size, seed=11)
    prod.dyad("produce", prod.path("p/f.bin"))
    with open(prod.path("p/f.bin"), "rb") as f:
        content = f.read()
    raw = Raw(unix_path=prod.socket, key=prod.key)
    try:
        tag = raw.request("dyad.fetch", upath="p/f.bin", transport="LOCAL")
        answer = raw.recv()
        assert (answer["type"], answer["tag"]) == (RESPONSE, tag), answer
        assert answer["meta"] == {"size": size, "transport": "LOCAL"}, answer["meta"]
        assert len(answer["fds"]) == 1, answer
        fd = answer["fds"][0]
        try:
            st, want = os.fstat(fd), os.stat(prod.path("p/f.bin"))
            assert (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino)
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
            assert os.pread(fd, size, 0) == content
        finally:
            os.close(fd)
        raw.send(UPDATE, tag, {"copied": size})
        end, _ = raw.collect(tag)
        assert end["type"] == END and end["meta"]["size"] == size, end
        assert not end["fds"]
    finally:
        raw.close()
    raw = Raw.to(prod)
    try:
        err, _ = raw.collect(raw.request("dyad.fetch", upath="p/f.bin", transport="LOCAL"))
        assert err["type"] == ERROR and err["errnum"] == errno.EOPNOTSUPP, err
        assert "Unix socket" in err["meta"]["msg"], err
    finally:
        raw.close()
    local = prod.status()["counters"]["per_transport"]["LOCAL"]
    assert local["served"] == 1 and local["errors"] == 1, local


def test_local_over_tcp_falls_back_to_the_next_transport():
    """A service without a Unix socket: a same-node consumer reaches it over
    TCP, LOCAL cannot start there, and AUTO takes the next transport; a fixed
    LOCAL mode fails saying why."""
    c = harness.Cluster(nodes=1, start=False)
    try:
        prod = c[0]
        prod.socket = None
        prod.start()
        view = harness.NodeView(prod, os.path.join(c.root, "view"))
        harness.write_file(prod.path("big.bin"), 9 << 20, seed=8)
        prod.dyad("produce", prod.path("big.bin"))
        p = view.dyad("consume", "--explain", view.path("big.bin"), env_extra=WAIT)
        assert "LOCAL failed to start: " in p.stdout and "Unix socket" in p.stdout, p.stdout
        assert sha(prod.path("big.bin")) == sha(view.path("big.bin"))
        os.unlink(view.path("big.bin"))
        # --json: the selection says which transport moved the file when the
        # chosen one could not start (it used to say LOCAL beside FLUX_RPC).
        p = view.dyad("--json", "consume", view.path("big.bin"), env_extra=WAIT)
        r = json.loads(p.stdout.splitlines()[-1])
        assert r["selection"]["chosen"] == "LOCAL" and r["transport"] != "LOCAL", r
        assert r["selection"]["used"] == r["transport"], r
        assert r["selection"]["fell_back_from"][0]["transport"] == "LOCAL", r
        os.unlink(view.path("big.bin"))
        p = view.dyad("consume", view.path("big.bin"), check=False, env_extra={**WAIT, "DYAD_DTL_MODE": "LOCAL"})
        assert p.returncode != 0 and "LOCAL needs the service's Unix socket" in p.stderr, p.stderr
        assert not os.path.exists(view.path("big.bin"))
    finally:
        c.cleanup()


def test_local_needs_no_access_to_the_producer_directory(cluster):
    """The consumer opens nothing by name: one that may not even enter the
    producer directory (0700, another user) still copies by LOCAL."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root (to run the consumer as nobody) and setpriv")
    prod = cluster[0]
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    if subprocess.run(as_nobody + [harness.DYAD, "--json", "config"], capture_output=True).returncode != 0:
        pytest.skip(f"nobody cannot run {harness.DYAD}")
    nobody = pwd.getpwnam("nobody")
    # The service admits nobody on its Unix socket (by default only its own
    # uid and root), and nobody has its own copy of the job key.
    prod.stop()
    prod.start(["--allow-uid", str(nobody.pw_uid)])
    harness.write_file(prod.path("secret/f.bin"), (5 << 20) + 3, seed=12)
    prod.dyad("produce", prod.path("secret/f.bin"))
    view = harness.NodeView(prod, os.path.join(cluster.root, "nobody-view"))
    os.chown(view.dir, nobody.pw_uid, nobody.pw_gid)
    key = os.path.join(view.dir, "nobody.key")
    shutil.copy(prod.key, key)
    os.chown(key, nobody.pw_uid, nobody.pw_gid)
    os.chmod(key, 0o600)
    os.chmod(cluster.root, 0o711)  # nobody may pass through to its directory and the socket
    os.chmod(prod.socket, 0o666)
    os.chmod(prod.dir, 0o700)
    assert os.stat(prod.dir).st_uid != nobody.pw_uid
    assert subprocess.run(as_nobody + ["test", "-r", prod.path("secret/f.bin")]).returncode != 0
    env = view.env(DYAD_DTL_MODE="LOCAL", DYAD_AUTH_KEY_FILE=key, DYAD_SERVICE_URI=prod.unix_uri, **WAIT)
    p = subprocess.run(as_nobody + [harness.DYAD, "--json", "consume", view.path("secret/f.bin")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["action"], r["transport"]) == ("fetched", "LOCAL"), r
    assert sha(view.path("secret/f.bin")) == sha(prod.path("secret/f.bin"))
    assert os.stat(view.path("secret/f.bin")).st_uid == nobody.pw_uid
    assert prod.status()["counters"]["per_transport"]["LOCAL"]["served"] == 1


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
        node.dyad("produce", node.path("big.bin"))
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
            time.sleep(0.5)  # not an ordering sleep: the interval of sampling in_use while transfers run
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


# A FLUX_RPC transfer's pipeline: 4 chunks of 1 MiB (kStreamDepth x kStreamChunk).
PIPELINE = 4 << 20


def test_a_slow_consumer_does_not_starve_fast_ones():
    """A consumer reading at 1 MB/s holds only its own pipeline, and fast
    consumers beside it finish. On the default budget nobody waits for memory
    at all; on the smallest budget (16M, where the slow one's share is 8M) the
    budget binds, the fast ones wait their turns and still finish, and the slow
    one keeps moving. (Throughput beside a slow consumer is a benchmark,
    bench/fairness_bench.py, not an assertion: it moves with machine load.)"""
    for memory in (None, "16M"):
        c = harness.Cluster(nodes=1, start=False)
        try:
            node = c[0]
            node.start([] if memory is None else ["--memory", memory])
            with open(node.path("slow.bin"), "wb") as fh:
                fh.truncate(256 << 20)
            for i in range(4):
                with open(node.path(f"fast{i}.bin"), "wb") as fh:
                    fh.truncate(64 << 20)
            node.dyad("produce", node.path("slow.bin"), *[node.path(f"fast{i}.bin") for i in range(4)])
            slow = Stream(node, "slow.bin")
            st = threading.Thread(target=slow.run, kwargs={"rate": 1e6})
            st.start()
            harness.wait_for(lambda: slow.bytes > 0 or not st.is_alive(), 30, "the slow consumer's first bytes")
            # Its pipeline fills: all its chunk buffers are held, waiting for it to read.
            node.wait_status(lambda s: s["memory"]["in_use"] >= PIPELINE or not st.is_alive(),
                             "the slow consumer's pipeline to fill")
            held = node.status()["memory"]["in_use"]
            assert 0 < held <= PIPELINE, f"the slow consumer holds {held} bytes, more than its pipeline"
            fast = [Stream(node, f"fast{i}.bin") for i in range(4)]
            threads = [threading.Thread(target=s.run) for s in fast]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert all(s.done and s.bytes == 64 << 20 for s in fast), [(s.bytes, s.error) for s in fast]
            before = slow.bytes
            harness.wait_for(lambda: slow.bytes > before or not st.is_alive(), what="the slow consumer to read on")
            assert st.is_alive() and slow.error is None and slow.bytes > before, "the slow consumer stopped"
            mem = node.status()["memory"]
            slow.s.shutdown(socket.SHUT_RDWR)
            st.join()
            if memory is None:
                assert mem["parked_total"] == 0, mem
                assert mem["peak"] <= 5 * (4 << 20), mem
            else:
                assert mem["parked_total"] > 0, f"the 16M budget never bound: {mem}"
                assert mem["peak"] <= 16 << 20, mem
        finally:
            c.cleanup()
