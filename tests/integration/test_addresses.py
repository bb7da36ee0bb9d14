# SPDX-License-Identifier: Apache-2.0
"""Transport addresses from a peer holding the key (docs/security.md,
"Transport addresses"): UCX worker addresses with every first byte,
truncated and random; libfabric fields likewise; a peer claiming another
consumer's id. dyadd answers each with an error or a transfer attempt,
never aborts, and keeps serving a legitimate consumer."""
import base64
import os
import random
import socket
import subprocess

import pytest

import harness
from rawwire import END, ERROR, Raw

CORPUS = os.path.join(harness.ROOT, "fuzz", "corpus", "address")
BUILT = harness.built_transports()


def seed(name):
    with open(os.path.join(CORPUS, name), "rb") as f:
        return f.read()


@pytest.fixture
def ucluster():
    if "UCX" not in BUILT:
        pytest.skip("this build has no UCX transport (libucx-dev not found at configure time)")
    c = harness.Cluster(nodes=2, env={"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"})
    yield c
    c.cleanup()


def produce(node, name, text):
    node.produce_text(name, text)


def legit_consume(prod, cons, name, mode):
    produce(prod, name, "legit " + name)
    cons.dyad("consume", cons.path(name), env_extra={"DYAD_DTL_MODE": mode, "DYAD_WAIT_TIMEOUT": 30})
    with open(cons.path(name)) as f:
        assert f.read() == "legit " + name


def fetch_ucx(node, blob, consumer="attacker"):
    """One fetch naming `blob` as the UCX worker address, on its own
    connection; the answer's frame, or None when the service is still
    trying to send (an address that passed the checks names a dead worker):
    then the connection is closed, which cancels the transfer."""
    return ucx_fetch_answer(node, 5, ucx_tag=7, ucx_proto="tag", ucx_worker=base64.b64encode(blob).decode(),
                            ucx_consumer=consumer)


def ucx_fetch_answer(node, timeout, **fields):
    """A UCX fetch of f.txt with `fields` on its own connection: the
    answer's final frame, or None if none came within `timeout`."""
    r = Raw.to(node, timeout=timeout)
    try:
        tag = r.request("dyad.fetch", upath="f.txt", transport="UCX", **fields)
        try:
            f, _ = r.collect(tag)
            return f
        except (socket.timeout, ConnectionError):
            return None
    finally:
        r.close()


def test_ucx_addresses_with_every_first_byte_truncated_and_random(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    produce(prod, "f.txt", "x" * 100)
    base = seed("seed-ucx-v1-tcp")
    blobs = [bytes([b]) + base[1:] for b in range(256)]
    blobs += [base[:k] for k in range(len(base))]
    rng = random.Random(15)
    blobs += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(100)]
    blobs += [base[:1] + bytes(rng.randrange(256) for _ in range(len(base) - 1)) for _ in range(50)]
    v2 = seed("seed-ucx-v2-tcp")
    blobs += [bytes([b]) + v2[1:] for b in range(256)] + [v2[:k] for k in range(len(v2))]
    refused = 0
    for blob in blobs:
        f = fetch_ucx(prod, blob)
        assert prod.proc.poll() is None, f"dyadd ended on address {blob.hex()}"
        if f is not None and f["type"] == ERROR and "malformed UCX worker address" in f["meta"]["msg"]:
            refused += 1
    # Nearly all are malformed; the few that parse name dead workers.
    assert refused >= len(blobs) - 40
    t = prod.status()["counters"]["per_transport"]["UCX"]["transport"]
    assert t["addresses_refused"] >= refused
    legit_consume(prod, cons, "after-ucx.txt", "UCX")
    assert not [n for n in os.listdir(".") if n.endswith(".btr")]


class UcxPeer:
    """A live UCX worker of the test's own (tests/tools/ucx_peer.c): a
    consumer that is not ours, with a real address and window key."""

    def __init__(self):
        exe = os.path.join(harness.BUILD, "bin", "ucx_peer")
        env = dict(os.environ, UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
        self.proc = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        line = self.proc.stdout.readline().decode().split()
        assert len(line) == 4, "ucx_peer did not start"
        self.worker, self.rkey = bytes.fromhex(line[0]), bytes.fromhex(line[1])
        self.window, self.window_size = int(line[2]), int(line[3])

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def peer():
    p = UcxPeer()
    yield p
    p.close()


def put_fetch(node, peer, rkey, consumer="attacker"):
    """A put-mode fetch naming the live peer's worker and `rkey` as its
    window's key: the answer's frame, or None while the transfer waits for
    slots the peer never grants (closing the connection cancels it)."""
    return ucx_fetch_answer(node, 3, ucx_tag=9, ucx_proto="put", ucx_worker=base64.b64encode(peer.worker).decode(),
                            ucx_consumer=consumer, ucx_window=peer.window, ucx_window_size=peer.window_size,
                            ucx_rkey=base64.b64encode(rkey).decode())


def test_ucx_window_keys_bent_every_way_are_refused_before_ucx(ucluster, peer):
    """ucp_ep_rkey_unpack takes no length: dyadd checks the key's layout
    first (peer_address.hpp). A live worker's real key, then the same key
    with every memory type, every MD map that declares a key past its end,
    truncated at every byte, and random."""
    prod, cons = ucluster[0], ucluster[1]
    produce(prod, "f.txt", "w" * 100)
    key = peer.rkey
    md_map = int.from_bytes(key[:8], "little")
    assert md_map and key[8] == 0, f"ucx_peer's key is not host memory: {key.hex()}"
    # The real key reaches UCX: no refusal.
    f = put_fetch(prod, peer, key)
    assert f is None or "malformed UCX window key" not in f["meta"].get("msg", ""), f
    rng = random.Random(17)
    bent = [key[:8] + bytes([t]) + key[9:] for t in range(1, 256)]
    bent += [(md_map | 1 << b).to_bytes(8, "little") + key[8:] for b in range(64)
             if not md_map >> b & 1]
    bent += [key[:k] for k in range(len(key))]
    bent += [key + bytes([0xFF]) + b"\1" * k for k in (1, 2, 4)]
    bent += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(40)]
    refused = 0
    for b in bent:
        f = put_fetch(prod, peer, b)
        assert prod.proc.poll() is None, f"dyadd ended on window key {b.hex()}"
        if f is not None and "malformed UCX window key" in f["meta"].get("msg", ""):
            refused += 1
    # Random keys whose map is 0 or all bits are refused too; a few random
    # blobs may happen to be well formed.
    assert refused >= len(bent) - 5, (refused, len(bent))
    t = prod.status()["counters"]["per_transport"]["UCX"]["transport"]
    assert t["rkeys_refused"] >= refused
    legit_consume(prod, cons, "after-rkeys.txt", "UCX")


def test_a_claimed_consumer_id_does_not_redirect_its_transfers(ucluster, peer):
    """The old cache gave the endpoint of the first claimant of an id to
    everybody naming it. The attacker claims the waiting consumer's
    node/pid/start-time id first, with the address and key of a live worker
    of its own (which would take the victim's bytes and stay up, so the
    claim would stick), and keeps that connection open while the victim's
    file is produced."""
    prod, cons = ucluster[0], ucluster[1]
    env = cons.env(DYAD_DTL_MODE="UCX", DYAD_WAIT_TIMEOUT=60)
    victim = subprocess.Popen([harness.DYAD, "consume", cons.path("v.txt")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = None
    try:
        with open(f"/proc/{victim.pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        victim_id = f"{socket.gethostname()}/{victim.pid}/{start}"
        produce(prod, "f.txt", "y" * 100)
        r = Raw.to(prod, timeout=5)
        r.request("dyad.fetch", upath="f.txt", transport="UCX", ucx_tag=9, ucx_proto="put",
                  ucx_worker=base64.b64encode(peer.worker).decode(), ucx_consumer=victim_id,
                  ucx_window=peer.window, ucx_window_size=peer.window_size,
                  ucx_rkey=base64.b64encode(peer.rkey).decode())
        produce(prod, "v.txt", "the victim's bytes")
        out, err = victim.communicate(timeout=120)
    finally:
        if r is not None:
            r.close()
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert victim.returncode == 0, err
    with open(cons.path("v.txt")) as f:
        assert f.read() == "the victim's bytes"


def test_libfabric_fields_from_a_peer_keep_dyadd_serving(cluster):
    if "MARGO" not in BUILT:
        pytest.skip("this build has no libfabric transport (libfabric-dev not found at configure time)")
    prod, cons = cluster[0], cluster[1]
    produce(prod, "f.txt", "z" * 10)
    rng = random.Random(16)
    junk = [None, 0, -1, 1 << 70, "", "x" * 5000, "\u0000", [], {}]
    junk += [bytes(rng.randrange(256) for _ in range(rng.randrange(40))).decode("latin-1") for _ in range(50)]
    for j in junk:
        r = Raw.to(prod, timeout=10)
        tag = r.request("dyad.fetch", upath="f.txt", transport="MARGO", ofi_proto=j,
                        ofi_addr=base64.b64encode(os.urandom(16)).decode())
        try:
            f, _ = r.collect(tag)
            assert f["type"] in (ERROR, END)
        except (socket.timeout, ConnectionError):
            pass  # a transfer under way, cancelled by closing
        r.close()
        assert prod.proc.poll() is None
    legit_consume(prod, cons, "after-ofi.txt", "MARGO")
