# SPDX-License-Identifier: Apache-2.0
"""The red-team findings of the trust issue, each as an attack on real
services by another process (this one, speaking the wire protocol, or a
program it starts): the attack fails, legitimate clients keep being served,
and no wrong byte is installed (docs/security.md)."""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading

import pytest

import harness
from rawwire import END, ERROR, HELLO, HDR, MAGIC, RESPONSE, VERSION, Raw


def produce(node, name, text):
    node.produce_text(name, text)


def assert_legit_consume(prod, cons, name="legit.txt", text="legit bytes"):
    produce(prod, name, text)
    cons.dyad("consume", cons.path(name), env_extra={"DYAD_WAIT_TIMEOUT": 20})
    with open(cons.path(name)) as f:
        assert f.read() == text


def spoofed_record(victim_upath, owner, endpoint, size=6):
    return json.dumps({"path": victim_upath, "owner": owner, "node": owner, "producer_dir": "/",
                       "endpoints": [endpoint], "size": size, "mtime_ns": 0, "mode": 0o644})


def test_peer_without_the_key_gets_a_refusal_and_nothing_else(cluster):
    prod = cluster[0]
    produce(prod, "listed.txt", "x")
    r = Raw.to(prod, key=None)  # a hello without a nonce: no key
    assert r.info["type"] == ERROR and r.info["errnum"] == 13
    msg = r.info["meta"]["msg"]
    assert msg.startswith("authentication required"), msg
    blob = json.dumps(r.info["meta"])
    assert prod.dir not in blob and "listed" not in blob and "node0" not in blob
    with pytest.raises((ConnectionError, OSError)):  # and the connection is closed
        r.request("kvs.list", ns="dyad")
        r.recv()
    # Skipping the hello gets the same.
    raw = Raw.to(prod, hello=False)
    raw.request("kvs.list", ns="dyad")
    f = raw.recv()
    assert f["type"] == ERROR and "authentication required" in f["meta"]["msg"]
    assert prod.status()["counters"]["auth_refused"] >= 2
    assert_legit_consume(prod, cluster[1])


def test_wrong_key_client_and_wrong_key_service(cluster):
    prod, cons = cluster[0], cluster[1]
    produce(prod, "k.txt", "keyed")
    other = os.path.join(cluster.root, "other.key")
    subprocess.run([harness.DYAD, "keygen", other], check=True, capture_output=True)
    # A client with another key: the service's proof does not verify.
    p = cons.dyad("consume", cons.path("k.txt"), check=False, env_extra={"DYAD_AUTH_KEY_FILE": other})
    assert p.returncode == 4, p.stderr
    assert "could not prove it holds the job's key" in p.stderr, p.stderr
    # A service with another key (an impostor on the consumer's path): refused by the client.
    fake = harness.Cluster(nodes=1, start=False)
    try:
        fake[0].extra_env["DYAD_AUTH_KEY_FILE"] = other
        fake[0].start()
        p = subprocess.run([harness.DYAD, "consume", cons.path("k.txt")], capture_output=True, text=True,
                           env=cons.env(DYAD_SERVICE_URI=fake[0].uri, DYAD_WAIT_TIMEOUT=5))
        assert p.returncode == 4 and "could not prove" in p.stderr, p.stderr
    finally:
        fake.cleanup()
    # A client without a key is told what to set.
    p = cons.dyad("consume", cons.path("k.txt"), check=False, env_extra={"DYAD_AUTH_KEY_FILE": ""})
    assert p.returncode == 4 and "DYAD_AUTH_KEY_FILE" in p.stderr, p.stderr
    assert not os.path.exists(cons.path("k.txt"))
    assert_legit_consume(prod, cons)


def test_key_file_with_loose_permissions_is_refused(cluster):
    loose = os.path.join(cluster.root, "loose.key")
    shutil.copy(cluster.key, loose)
    os.chmod(loose, 0o644)
    cons = cluster[1]
    p = cons.dyad("ls", check=False, env_extra={"DYAD_AUTH_KEY_FILE": loose})
    # A key file the client cannot use is a configuration error (exit 1).
    assert p.returncode == 1 and "chmod 600" in p.stderr and loose in p.stderr, p.stderr
    d = subprocess.run([harness.DYADD, "--auth-key", loose, "--listen", "127.0.0.1:0",
                        os.path.join(cluster.root, "x")], capture_output=True, text=True, timeout=30)
    assert d.returncode != 0 and "chmod 600" in d.stderr, d.stderr


def test_without_a_key_only_loopback_is_served(tmp_path):
    d = subprocess.run([harness.DYADD, "--listen", "0.0.0.0:0", str(tmp_path / "p")],
                       capture_output=True, text=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if not k.startswith("DYAD_")})
    assert d.returncode != 0
    assert "--auth-key" in d.stderr and "dyad keygen" in d.stderr and "--insecure" in d.stderr, d.stderr


def test_clients_cannot_write_the_store(cluster):
    """Spoofed data: a record naming the attacker's bytes, put by a client
    (even one with the key): refused; consumers get the real file."""
    prod, cons = cluster[0], cluster[1]
    key = harness_key_of(cons, "victim.txt")
    for k in (None, cluster.key):
        r = Raw.to(prod, key=k)
        if r.info["type"] != HELLO:
            continue  # no key: refused at the hello already
        f, _ = r.collect(r.request("kvs.put", ns="dyad", key=key,
                                   value=spoofed_record("victim.txt", "node0", "tcp://127.0.0.1:9")))
        assert f["type"] == ERROR and f["errnum"] == 1, f  # EPERM
        assert "only services write" in f["meta"]["msg"]
        r.close()
    produce(prod, "victim.txt", "genuine")
    cons.dyad("consume", cons.path("victim.txt"), env_extra={"DYAD_WAIT_TIMEOUT": 20})
    with open(cons.path("victim.txt")) as f:
        assert f.read() == "genuine"


def test_a_service_cannot_take_another_services_record(cluster):
    prod, cons = cluster[0], cluster[1]
    produce(prod, "owned.txt", "by node0")
    key = harness_key_of(cons, "owned.txt")
    r = Raw.to(prod, role="service", service_id="node1")
    f, _ = r.collect(r.request("kvs.put", ns="dyad", key=key,
                               value=spoofed_record("owned.txt", "node1", "tcp://127.0.0.1:9")))
    assert f["type"] == ERROR and f["errnum"] == 17 and "produced by service 'node0'" in f["meta"]["msg"], f
    f, _ = r.collect(r.request("kvs.put", ns="dyad.services", key="node0", value="{}"))
    assert f["type"] == ERROR and f["errnum"] == 1, f
    r.close()
    cons.dyad("consume", cons.path("owned.txt"))
    with open(cons.path("owned.txt")) as f:
        assert f.read() == "by node0"


def test_two_producers_of_one_path(cluster):
    a, b = cluster[0], cluster[1]
    produce(a, "same.txt", "from a")
    with open(b.path("same.txt"), "w") as f:
        f.write("from b")
    p = b.dyad("produce", b.path("same.txt"), check=False)
    assert p.returncode != 0
    assert "same.txt" in p.stderr and "produced by service 'node0'" in p.stderr, p.stderr
    # The record is still a's, and a may produce it again.
    produce(a, "same.txt", "from a, v2")
    st = json.loads(b.dyad("--json", "stat", b.path("same.txt")).stdout)
    assert st["owner"] == "node0" and st["generation"] == 2


def test_a_name_spelling_another_paths_key_cannot_lock_its_producer_out(cluster):
    """DYAD's key of "data0.txt" at depth 3 (bins 1024) is
    "17f.204.15b.data0.txt", the key of a file of that name at depth 0. The
    file of the deeper key holds it, whichever was produced first."""
    genuine, other = cluster[0], cluster[1]
    shallow = {"DYAD_KEY_DEPTH": 0}
    # the other service takes the key first
    with open(other.path("17f.204.15b.data0.txt"), "w") as f:
        f.write("not data0")
    other.dyad("produce", other.path("17f.204.15b.data0.txt"), env_extra=shallow)
    produce(genuine, "data0.txt", "genuine data0")  # was EEXIST, forever
    other.dyad("consume", other.path("data0.txt"), env_extra={"DYAD_WAIT_TIMEOUT": 20})
    with open(other.path("data0.txt")) as f:
        assert f.read() == "genuine data0"
    # and once the genuine one holds it, the spelling is refused, saying why
    p = other.dyad("produce", other.path("17f.204.15b.data0.txt"), env_extra=shallow, check=False)
    assert p.returncode != 0, p.stdout
    assert "deeper DYAD_KEY_DEPTH" in p.stderr and "'data0.txt'" in p.stderr, p.stderr
    st = json.loads(other.dyad("--json", "stat", other.path("data0.txt")).stdout)
    assert st["owner"] == "node0", st


def test_unproduced_files_are_not_served(cluster):
    prod, cons = cluster[0], cluster[1]
    with open(prod.path("private.txt"), "w") as f:
        f.write("never produced")
    r = Raw.to(prod)
    for transport in ("FLUX_RPC", "LOCAL"):
        f, data = r.collect(r.request("dyad.fetch", upath="private.txt", transport=transport))
        assert f["type"] == ERROR, f
        assert data == b"" and "never produced" not in json.dumps(f["meta"])
        if transport == "FLUX_RPC":
            assert f["errnum"] == 2 and "has not been produced" in f["meta"]["msg"], f
    r.close()
    assert prod.status()["counters"]["refused_unproduced"] >= 1
    assert_legit_consume(prod, cons)


def test_hard_links_and_reserved_paths(cluster):
    prod, cons = cluster[0], cluster[1]
    outside = os.path.join(cluster.root, "outside-secret.txt")
    with open(outside, "w") as f:
        f.write("secret")
    os.link(outside, prod.path("linked.txt"))
    p = prod.dyad("produce", prod.path("linked.txt"), check=False)
    assert p.returncode == 2 and "hard links" in p.stderr, p.stderr
    # DYAD's own directory is never consumed (a lock stripe stays a lock).
    assert_legit_consume(prod, cons)
    locks = os.path.join(cons.dir, ".dyad", "locks")
    stripe = os.path.join(locks, sorted(os.listdir(locks))[0])
    before = os.stat(stripe)
    p = cons.dyad("consume", stripe, check=False, env_extra={"DYAD_WAIT_TIMEOUT": 1})
    assert p.returncode == 2 and ".dyad/" in p.stderr, p.stderr
    after = os.stat(stripe)
    assert (before.st_ino, before.st_size) == (after.st_ino, after.st_size)
    p = prod.dyad("produce", prod.path(".dyad/x"), check=False)
    assert p.returncode == 2 and ".dyad/" in p.stderr, p.stderr
    # A `..` that stays inside is fine.
    os.makedirs(prod.path("sub"), exist_ok=True)
    produce(prod, "inside.txt", "inside")
    prod.dyad("produce", prod.path("sub/../inside.txt"))
    cons.dyad("consume", os.path.join(cons.dir, "sub", "..", "inside.txt"))
    with open(cons.path("inside.txt")) as f:
        assert f.read() == "inside"


def test_rewrite_during_a_fetch_installs_nothing(cluster):
    """The file is rewritten in place while being sent (mtime even put
    back): the fetch ends in ESTALE, not in a mix of two versions."""
    prod, cons = cluster[0], cluster[1]
    size = 64 << 20
    harness.write_file(prod.path("moving.bin"), size, seed=5)
    prod.dyad("produce", prod.path("moving.bin"))
    from rawwire import Stream
    s = Stream(prod, "moving.bin")
    t = threading.Thread(target=s.run, kwargs={"rate": 20e6})
    t.start()
    harness.wait_for(lambda: s.bytes > (1 << 20) or not t.is_alive(), 30, "the first bytes of the fetch")
    st = os.stat(prod.path("moving.bin"))
    with open(prod.path("moving.bin"), "r+b") as f:
        f.seek(size - 4096)
        f.write(b"\xff" * 4096)
    os.utime(prod.path("moving.bin"), ns=(st.st_atime_ns, st.st_mtime_ns))
    t.join(120)
    assert not s.done and s.error == 116, (s.done, s.error)  # ESTALE, no END
    assert prod.status()["counters"]["refused_stale"] >= 1
    # The CLI consumer is refused too (the file no longer matches its record).
    p = cons.dyad("consume", cons.path("moving.bin"), check=False, env_extra={"DYAD_WAIT_TIMEOUT": "1"})
    assert p.returncode == 5 and "changed since it was published" in p.stderr, p.stderr
    assert not os.path.exists(cons.path("moving.bin"))
    assert [n for n in os.listdir(cons.dir) if "dyad-" in n] == []
    prod.dyad("produce", prod.path("moving.bin"))
    cons.dyad("consume", cons.path("moving.bin"))
    assert harness.sha256(prod.path("moving.bin")) == harness.sha256(cons.path("moving.bin"))


class FakeService:
    """An impostor without the key: answers hello as a service of no key,
    the store lookup with a spoofed record pointing at itself, and a LOCAL
    fetch with the path of a secret file."""

    def __init__(self, secret, node_name, size):
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(8)
        self.port = self.srv.getsockname()[1]
        self.uri = f"tcp://127.0.0.1:{self.port}"
        self.secret, self.node, self.size = secret, node_name, size
        self.fetches = 0
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def send(self, c, typ, tag, meta):
        m = json.dumps(meta).encode()
        c.sendall(HDR.pack(MAGIC, VERSION, typ, 0, tag, 0, len(m), 0) + m)

    def recv(self, c):
        h = b""
        while len(h) < HDR.size:
            chunk = c.recv(HDR.size - len(h))
            if not chunk:
                raise ConnectionError
            h += chunk
        _, _, typ, _, tag, _, ml, _ = HDR.unpack(h)
        m = b""
        while len(m) < ml:
            m += c.recv(ml - len(m))
        return typ, tag, json.loads(m) if ml else None

    def serve(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self.session, args=(c,), daemon=True).start()

    def session(self, c):
        try:
            self.recv(c)
            ident = {"service_id": self.node, "node": self.node, "namespace": "dyad", "producer_dir": "/",
                     "kvs": "local", "endpoints": [self.uri], "transports": [], "auth": "none"}
            self.send(c, HELLO, 0, ident)
            while True:
                typ, tag, m = self.recv(c)
                if m.get("topic") == "kvs.get":
                    rec = spoofed_record("loot.txt", self.node, self.uri, self.size)
                    self.send(c, END, tag, {"value": rec, "version": 1})
                elif m.get("topic") == "dyad.fetch":
                    self.fetches += 1
                    st = os.stat(self.secret)
                    self.send(c, RESPONSE, tag, {"size": self.size, "transport": "LOCAL", "path": self.secret,
                                                 "dev": st.st_dev, "ino": st.st_ino})
                    self.recv(c)  # the consumer's {"copied"}, if it copied
                    self.send(c, END, tag, {"size": self.size, "xxh3": ""})
                else:
                    self.send(c, ERROR, tag, {"msg": "no", "rc": -2004})
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            c.close()

    def close(self):
        self.srv.close()


def test_a_fake_local_answer_cannot_make_a_consumer_copy_a_secret():
    """Without keys (loopback only), a local impostor service answers a
    consumer's lookup and its LOCAL fetch with the path of a file only root
    may read: the consumer takes no path from the network, installs nothing."""
    c = harness.Cluster(nodes=1, auth=False)
    fake = None
    try:
        cons = c[0]
        secret = os.path.join(c.root, "shadow")
        with open(secret, "w") as f:
            f.write("root:secret-hash\n")
        os.chmod(secret, 0o600)
        fake = FakeService(secret, cons.name, os.path.getsize(secret))
        p = subprocess.run([harness.DYAD, "consume", cons.path("loot.txt")], capture_output=True, text=True,
                           env=cons.env(DYAD_SERVICE_URI=fake.uri, DYAD_DTL_MODE="LOCAL", DYAD_WAIT_TIMEOUT=5),
                           timeout=60)
        assert p.returncode != 0, p.stdout
        assert not os.path.exists(cons.path("loot.txt"))
        for name in os.listdir(cons.dir):
            path = os.path.join(cons.dir, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    assert b"secret-hash" not in f.read(), name
    finally:
        if fake:
            fake.close()
        c.cleanup()


def test_a_keyed_consumer_refuses_a_service_without_key(cluster):
    cons = cluster[1]
    fake = FakeService(os.path.join(cluster.root, "job.key"), "node1", 65)
    try:
        p = cons.dyad("consume", cons.path("loot.txt"), check=False,
                      env_extra={"DYAD_SERVICE_URI": fake.uri, "DYAD_WAIT_TIMEOUT": 5})
        assert p.returncode == 4 and "does not authenticate" in p.stderr, p.stderr
        assert fake.fetches == 0
    finally:
        fake.close()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_unix_socket_admits_only_the_same_user_or_root():
    c = harness.Cluster(nodes=1, start=False, auth=False)
    try:
        node = c[0]
        sock = node.socket
        os.chmod(c.root, 0o755)
        node.start()
        os.chmod(sock, 0o666)
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        env = node.env(DYAD_SERVICE_URI=f"unix:{sock}")
        p = subprocess.run(as_nobody + [harness.DYAD, "service", "status"], capture_output=True, text=True,
                           env=env, timeout=30)
        assert p.returncode == 4 and "may not use this service's Unix socket" in p.stderr, p.stderr
        assert node.status()["counters"]["auth_refused"] == 1
        node.stop()
        node.start(["--allow-uid", "65534"])
        os.chmod(sock, 0o666)
        p = subprocess.run(as_nobody + [harness.DYAD, "service", "status"], capture_output=True, text=True,
                           env=env, timeout=30)
        assert p.returncode == 0, p.stderr
    finally:
        c.cleanup()


def harness_key_of(node, upath):
    return node.dyad("key", upath).stdout.strip()


def test_the_store_has_a_cap_and_says_so():
    """A store that is full refuses puts with a clear error (and counts
    them); what it holds stays served."""
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start(["--store-max", "16K"])
        names = [f"f{i:03d}.txt" for i in range(80)]
        for n in names:
            with open(node.path(n), "w") as f:
                f.write(n)
        p = node.dyad("produce", *[node.path(n) for n in names], check=False)
        assert p.returncode != 0 and "metadata store is full" in p.stderr and "--store-max" in p.stderr, p.stderr
        st = node.status()["store"]
        assert st["refused"] >= 1 and st["bytes"] <= st["max_bytes"] == 16 << 10, st
        view = harness.NodeView(node, os.path.join(c.root, "view"))
        view.dyad("consume", view.path("f000.txt"))
        with open(view.path("f000.txt")) as f:
            assert f.read() == "f000.txt"
    finally:
        c.cleanup()
