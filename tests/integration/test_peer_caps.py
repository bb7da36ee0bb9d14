# SPDX-License-Identifier: Apache-2.0
"""Caps per peer (docs/security.md, "Caps per peer"): a peer that takes all
it can and gives nothing back (tests/integration/attacker.py, a process of
its own, from another address than the consumers') gets a clear error at its
cap, is counted, and a legitimate consumer beside it is still served. The
starvation cases of issue 15: connections, LOCAL descriptors, the memory
budget, the MARGO pool.

Deadlines: a legitimate consume must finish within CONSUME_DEADLINE (a
transfer that waited for the attacker's resources would take --send-timeout,
set far above it); what a disconnected peer held is let go within
RELEASE_DEADLINE (documented as "at once")."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ATTACKER_HOST = "127.0.0.66"  # another host, as far as dyadd can tell
CONSUME_DEADLINE = 30
RELEASE_DEADLINE = 10
SEND_TIMEOUT = "300"  # what the attacker's transfers would hold without the caps


class Attacker:
    def __init__(self, node, mode, n, upath="", unix=False, source=ATTACKER_HOST, env=None):
        args = [sys.executable, os.path.join(HERE, "attacker.py"), mode, "-n", str(n), "--upath", upath,
                "--host", node.host, "--port", str(node.port)]
        if node.key:
            args += ["--key", node.key]
        if unix:
            args += ["--unix", node.socket]
        elif source:
            args += ["--source", source]
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=dict(os.environ, **(env or {})))
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"attacker failed: {self.p.stderr.read()}")
        self.result = json.loads(line)

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def fd_count(node):
    return len(os.listdir(f"/proc/{node.proc.pid}/fd"))


def consume(node, path, **env):
    p = node.dyad("consume", path, check=False, timeout=CONSUME_DEADLINE,
                  env_extra=dict({"DYAD_WAIT_TIMEOUT": 20}, **env))
    assert p.returncode == 0, p.stderr
    return p


def produce(node, name, size, sparse=False):
    path = node.path(name)
    if sparse:
        with open(path, "wb") as f:
            f.truncate(size)
    else:
        harness.write_file(path, size)
    node.dyad("produce", path)
    return path


@pytest.fixture
def one_node(request):
    """One service (and its store) started with the test's options."""
    c = harness.Cluster(nodes=2, start=False)
    try:
        c[0].start(getattr(request, "param", []) + ["--send-timeout", SEND_TIMEOUT])
        c[1].start(["--send-timeout", SEND_TIMEOUT])
    except Exception:
        c.cleanup()
        raise
    yield c
    c.cleanup()


@pytest.mark.parametrize("one_node", [["--max-connections-per-peer", "8"]], indirect=True)
def test_connections_beyond_the_cap_are_refused_and_others_still_connect(one_node):
    prod, cons = one_node[0], one_node[1]
    produce(prod, "c.bin", 1 << 20)
    a = Attacker(prod, "connections", 12)
    try:
        assert a.result["held"] == 8, a.result
        assert len(a.result["refused"]) == 4
        msg = a.result["refused"][0]
        assert f"too many connections from host {ATTACKER_HOST}" in msg, msg
        assert "--max-connections-per-peer" in msg, msg
        consume(cons, cons.path("c.bin"))  # another host: served
        st = prod.status()
        assert st["counters"]["refused_peer_connections"] == 4, st["counters"]
        assert st["peers"]["busiest_peer_connections"] == 8, st["peers"]
    finally:
        a.stop()
    # Gone: its connections are no longer counted.
    prod.wait_status(lambda s: s["peers"]["busiest_peer_connections"] < 8, "the attacker's connections closed",
                     timeout=RELEASE_DEADLINE)


@pytest.mark.parametrize("one_node", [["--max-connections-per-peer", "8"]], indirect=True)
def test_silent_connections_beyond_the_cap_are_closed_at_once(one_node):
    """A refused connection is answered at its first frame; one that never
    sends waits at most kRefusalTimeout (1 s), and at most 8 of a peer's
    wait at once: the rest close at once, so a peer at its cap cannot fill
    the service's connection table with sockets that never speak."""
    prod, cons = one_node[0], one_node[1]
    produce(prod, "s.bin", 1 << 20)
    a = Attacker(prod, "connections", 8)
    silent = []
    try:
        assert a.result["held"] == 8, a.result
        before = fd_count(prod)
        for _ in range(60):
            s = socket.socket()
            s.bind((ATTACKER_HOST, 0))
            s.connect((prod.host, prod.port))
            silent.append(s)
        time.sleep(0.5)
        assert fd_count(prod) <= before + 8 + 2, (before, fd_count(prod))
        closed = 0
        for s in silent:
            s.settimeout(RELEASE_DEADLINE)
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == len(silent)
        consume(cons, cons.path("s.bin"))
        st = prod.status()
        assert st["counters"]["refused_peer_connections"] >= 60, st["counters"]
    finally:
        for s in silent:
            s.close()
        a.stop()


@pytest.mark.parametrize("one_node", [["--max-local-per-peer", "16"]], indirect=True)
def test_local_descriptors_are_capped_per_process_and_let_go_on_disconnect(one_node):
    prod = one_node[0]
    produce(prod, "l.bin", 1 << 20)
    base = fd_count(prod)
    a = Attacker(prod, "local", 40, upath="l.bin", unix=True)
    try:
        assert a.result["held"] == 16, a.result
        assert len(a.result["refused"]) == 24
        msg = a.result["refused"][0]
        assert "--max-local-per-peer" in msg and "LOCAL fetches holding an open file" in msg, msg
        assert f"pid {a.p.pid}" in msg, msg
        # A consumer process on the same node is another peer: served by LOCAL.
        view = harness.NodeView(prod, os.path.join(one_node.root, "view"))
        p = consume(view, view.path("l.bin"), DYAD_DTL_MODE="LOCAL")
        assert os.path.getsize(view.path("l.bin")) == 1 << 20, p.stderr
        st = prod.status()
        assert st["counters"]["refused_peer_local"] == 24, st["counters"]
        assert fd_count(prod) >= base + 16
    finally:
        a.stop()
    harness.wait_for(lambda: fd_count(prod) <= base + 1, timeout=RELEASE_DEADLINE,
                     what="the attacker's descriptors released")


@pytest.mark.parametrize("one_node", [["--max-fetches-per-peer", "4"]], indirect=True)
def test_fetches_in_progress_are_capped_per_peer(one_node):
    prod = one_node[0]
    produce(prod, "f.bin", 4096)
    a = Attacker(prod, "local", 10, upath="f.bin", unix=True)
    try:
        assert a.result["held"] == 4, a.result
        msg = a.result["refused"][0]
        assert "4 fetches in progress" in msg and "--max-fetches-per-peer" in msg, msg
        view = harness.NodeView(prod, os.path.join(one_node.root, "view"))
        consume(view, view.path("f.bin"))  # another process: served
        assert prod.status()["counters"]["refused_peer_fetches"] == 6
    finally:
        a.stop()


@pytest.mark.parametrize("one_node", [["--max-local-per-peer", "300"]], indirect=True)
def test_a_paused_connection_lets_go_when_its_peer_hangs_up(one_node):
    """260 unconfirmed fetches on one connection: the service stops reading
    it (256 in progress); a hang-up is still seen at once, not at the
    fetches' deadline (--send-timeout 300)."""
    prod = one_node[0]
    produce(prod, "p.bin", 4096)
    base = fd_count(prod)
    a = Attacker(prod, "local", 256, upath="p.bin", unix=True)
    try:
        assert a.result["held"] == 256, a.result
        assert fd_count(prod) >= base + 256
    finally:
        a.stop()
    harness.wait_for(lambda: fd_count(prod) <= base + 1, timeout=RELEASE_DEADLINE,
                     what="the paused connection's descriptors released")


@pytest.mark.parametrize("one_node", [["--memory", "64M"]], indirect=True)
def test_a_peer_that_never_reads_holds_at_most_its_share_of_the_budget(one_node):
    prod, cons = one_node[0], one_node[1]
    produce(prod, "big.bin", 1 << 30, sparse=True)
    produce(prod, "ten.bin", 10 << 20)
    a = Attacker(prod, "stream", 40, upath="big.bin")
    try:
        # Its transfers have taken what they may (16 MiB: a quarter of 64M).
        st = prod.wait_status(lambda s: s["memory"]["in_use"] >= 16 << 20, "the attacker holding memory")
        consume(cons, cons.path("ten.bin"), DYAD_DTL_MODE="FLUX_RPC")
        assert os.path.getsize(cons.path("ten.bin")) == 10 << 20
        st = prod.status()["memory"]
        assert st["per_peer"] == 16 << 20, st
        assert st["peer_limited_total"] > 0, st
        # Twice its share at most (within the share it reads ahead; a
        # connection holding nothing still gets its first buffer up to twice
        # it: docs/design.md, "Fair shares") + the consumer's share.
        assert st["peak"] <= 2 * (16 << 20) + (16 << 20), st
    finally:
        a.stop()


@pytest.mark.parametrize("one_node", [["--memory", "64M"]], indirect=True)
def test_small_files_that_are_never_read_hold_at_most_the_peers_share(one_node):
    """A small file is read whole into one buffer and sent with its END
    (the cheap path): a peer that never reads holds a buffer only while its
    answer waits for room in the socket, never more than its share; a
    consumer beside it is served."""
    prod, cons = one_node[0], one_node[1]
    produce(prod, "small.bin", 200 << 10)
    produce(prod, "ten.bin", 10 << 20)
    a = Attacker(prod, "stream", 200, upath="small.bin")
    try:
        st = prod.wait_status(lambda s: s["counters"]["per_transport"]["FLUX_RPC"]["requests"] >= 200,
                              "the attacker's 200 fetches")
        assert st["memory"]["in_use"] <= 16 << 20, st["memory"]
        consume(cons, cons.path("ten.bin"), DYAD_DTL_MODE="FLUX_RPC")
        assert harness.sha256(cons.path("ten.bin")) == harness.sha256(prod.path("ten.bin"))
        st = prod.status()["memory"]
        assert st["peak"] <= (16 << 20) + (16 << 20), st
    finally:
        a.stop()
    # Gone: everything it held comes back.
    prod.wait_status(lambda s: s["memory"]["in_use"] == 0, "the attacker's buffers released",
                     timeout=RELEASE_DEADLINE)


@pytest.mark.skipif("MARGO" not in harness.built_transports(), reason="this build has no libfabric transport")
def test_unacknowledged_margo_fetches_hold_at_most_their_share_of_the_pool(one_node):
    prod, cons = one_node[0], one_node[1]
    produce(prod, "m.bin", 64 << 20, sparse=True)
    produce(prod, "m10.bin", 10 << 20)
    a = Attacker(prod, "margo", 6, upath="m.bin")
    try:
        assert a.result["held"] == 6, a.result
        consume(cons, cons.path("m10.bin"), DYAD_DTL_MODE="MARGO", DYAD_TRANSFER_TIMEOUT=20)
        assert os.path.getsize(cons.path("m10.bin")) == 10 << 20
        protos = prod.status()["counters"]["per_transport"]["MARGO"]["transport"]["protocols"]
        assert sum(p["peer_waits"] for p in protos.values()) > 0, protos
    finally:
        a.stop()


# Issue 31: caps per principal (a local user, whatever address or socket it
# comes from) and memory no admitted peer can pin with waiting requests. The
# attacker is another local user (nobody) of a keyless service: what any
# user of a shared node can do to root's dyadd in the default set-up.
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
LOOPBACK_SOURCES = ",".join(f"127.0.0.{i}" for i in range(2, 10))


def nobody_can_run():
    return os.geteuid() == 0 and subprocess.run(AS_NOBODY + [sys.executable, "-c", ""]).returncode == 0


@pytest.fixture
def keyless(request):
    """Two keyless services (loopback only, as the systemd unit runs them)."""
    c = harness.Cluster(nodes=2, start=False, auth=False)
    try:
        c[0].start(getattr(request, "param", []))
        c[1].start()
    except Exception:
        c.cleanup()
        raise
    yield c
    c.cleanup()


class NobodyAttacker(Attacker):
    """attacker.py as another local user (nobody), with room for thousands of sockets."""

    def __init__(self, node, mode, n, *extra):
        import resource

        def more_fds():
            resource.setrlimit(resource.RLIMIT_NOFILE, (16384, 16384))

        args = AS_NOBODY + [sys.executable, os.path.join(HERE, "attacker.py"), mode, "-n", str(n),
                            "--host", node.host, "--port", str(node.port), *extra]
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, preexec_fn=more_fds)
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"attacker failed: {self.p.stderr.read()}")
        self.result = json.loads(line)


def status_over(node, uri):
    p = node.dyad("--json", "service", "status", check=False, timeout=20, env_extra={"DYAD_SERVICE_URI": uri})
    assert p.returncode == 0, f"dyad service status over {uri} failed: {p.stderr}"
    return json.loads(p.stdout)


@pytest.mark.skipif(not nobody_can_run(), reason="needs root (to run the attacker as nobody) and setpriv")
def test_a_local_user_is_one_peer_whatever_loopback_address_it_binds(keyless):
    """Finding 4: a user binding 127.0.0.2..9 took 8 x 512 connections, the
    whole table, and `dyad service status` failed. A local user is its uid:
    512 connections in all, then refused."""
    prod, cons = keyless[0], keyless[1]
    produce(prod, "u.bin", 1 << 20)
    nobody = subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True).stdout.strip()
    a = NobodyAttacker(prod, "fill", 600, "--sources", LOOPBACK_SOURCES)
    try:
        assert a.result["held"] <= 512, a.result["held"]
        assert f"too many connections from uid {nobody}" in a.result["refused"][0], a.result["refused"][:2]
        st = status_over(prod, prod.uri)
        status_over(prod, prod.unix_uri)
        consume(cons, cons.path("u.bin"))
        assert st["counters"]["refused_peer_connections"] >= 8, st["counters"]
        assert st["peers"]["busiest_peer_connections"] <= 512, st["peers"]
    finally:
        a.stop()


@pytest.mark.skipif(not nobody_can_run(), reason="needs root (to run the attacker as nobody) and setpriv")
@pytest.mark.parametrize("keyless", [["--max-connections-per-peer", "0"]], indirect=True)
def test_a_full_connection_table_keeps_slots_for_the_services_own_uid(keyless):
    """Finding 4: with no cap per peer, another user fills the 4,096-slot
    table; the last slots stay for the service's own uid (and root): its
    `dyad service status`, on TCP and on the Unix socket, and the other
    service's fetch of a consume."""
    prod, cons = keyless[0], keyless[1]
    produce(prod, "t.bin", 1 << 20)
    a = NobodyAttacker(prod, "fill", 4200, "--sources", LOOPBACK_SOURCES)
    try:
        assert a.result["held"] >= 4000, a.result["held"]
        st = status_over(prod, prod.uri)
        status_over(prod, prod.unix_uri)
        consume(cons, cons.path("t.bin"))
        assert st["counters"]["refused_connections_table_full"] >= 1, st["counters"]
        assert st["counters"]["reserved_connections_admitted"] >= 1, st["counters"]
    finally:
        a.stop()


RSS_GROWTH_LIMIT_KIB = 96 * 1024


@pytest.mark.skipif(not nobody_can_run(), reason="needs root (to run the attacker as nobody) and setpriv")
def test_padded_waits_do_not_pin_memory(keyless):
    """Finding 5: 256 waits for an absent record on one connection, each
    padded with ~1 MiB of JSON the service never reads, took dyadd from 19 MB
    to 2.1 GB. The padding is dropped before the handler runs: RSS stays
    within RSS_GROWTH_LIMIT_KIB, and a consumer beside it is served."""
    prod, cons = keyless[0], keyless[1]
    produce(prod, "w.bin", 1 << 20)
    pid = prod.proc.pid
    base = harness.rss_kib(pid)
    args = AS_NOBODY + [sys.executable, os.path.join(HERE, "attacker.py"), "waits", "-n", "256", "--pad",
                        str((1 << 20) - 4096), "--host", prod.host, "--port", str(prod.port)]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    most = base
    try:
        # Watched while it sends: stopped (and failed) as soon as it passes
        # the bound, before it takes the machine's memory.
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        line = ""
        deadline = time.monotonic() + 60
        while not line and time.monotonic() < deadline and p.poll() is None:
            most = max(most, harness.rss_kib(pid))
            assert most - base < RSS_GROWTH_LIMIT_KIB, f"dyadd grew from {base} KiB to {most} KiB"
            if sel.select(timeout=0.05):
                line = p.stdout.readline()
        assert line, f"attacker failed: {p.stderr.read() if p.poll() is not None else 'timed out'}"
        result = json.loads(line)
        most = max(most, harness.rss_kib(pid))
        assert most - base < RSS_GROWTH_LIMIT_KIB, f"dyadd grew from {base} KiB to {most} KiB"
        assert result["held"] + len(result["refused"]) == 256, result
        consume(cons, cons.path("w.bin"))
        st = prod.status()
        assert st["store"]["waiters"] >= result["held"], st["store"]
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.parametrize("keyless", [["--max-request-bytes-per-peer", "64K", "--max-wait", "1"]], indirect=True)
def test_arguments_held_by_waiting_requests_are_capped_and_waits_end(keyless):
    """Finding 5: the arguments requests in progress hold are capped per
    peer (ENOBUFS, a clear error, a counter), and a wait without a deadline
    of its own ends at --max-wait (the client would ask again)."""
    from rawwire import ERROR, Raw
    prod = keyless[0]
    r = Raw(prod.host, prod.port)
    # Charged what it holds in memory, not its text: 200 KB of "[0,0,...]"
    # is 1.6 MB of parsed values, over the peer's 64 KiB at once.
    r.request("dyad.fetch", upath="nothing.bin", pad=[0] * 100000)
    f = r.recv()
    assert f["type"] == ERROR and f["errnum"] == 105, f  # ENOBUFS
    assert "--max-request-bytes-per-peer" in f["meta"]["msg"], f["meta"]
    tags = []
    for i in range(40):  # 4 KiB keys: ~4.3 KiB held each, 64 KiB allows 14
        tags.append(r.request("kvs.get", ns="dyad", key=f"never-{i}".ljust(4000, "k"), wait=True))
    r.s.settimeout(5)
    refused, expired = [], []
    t0 = time.monotonic()
    while len(refused) + len(expired) < len(tags):
        f = r.recv()
        assert f["type"] == ERROR, f
        (expired if f["errnum"] == 110 else refused).append(f)  # ETIMEDOUT
    took = time.monotonic() - t0
    assert 20 <= len(refused) <= 30, len(refused)
    msg = refused[0]["meta"]["msg"]
    assert "--max-request-bytes-per-peer" in msg and "bytes of arguments" in msg, msg
    assert len(expired) == len(tags) - len(refused)
    assert took < 4, took  # ended at --max-wait 1, not never
    st = prod.status()
    assert st["counters"]["refused_peer_request_bytes"] == len(refused) + 1, st["counters"]
    assert st["peers"]["request_bytes_held"] < 1024, st["peers"]  # (the status request itself)
