# SPDX-License-Identifier: Apache-2.0
"""The authenticated channel (docs/security.md, "An authenticated channel"):
a hello relayed by a process without the key admits nothing, and no frame
can be injected, replayed or changed on a keyed connection. The attacker is
a process of its own (relay.py), or this one speaking the wire protocol."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import harness
from rawwire import END, ERROR, HELLO, REQUEST, Raw

HERE = os.path.dirname(os.path.abspath(__file__))


def produce(node, name, text):
    node.produce_text(name, text)


def start_relay(cluster, mode, target, service_id):
    ready = os.path.join(cluster.root, f"relay-{mode}.port")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "relay.py"), mode, "--host", target.host,
                          "--port", str(target.port), "--service-id", service_id, "--ready", ready],
                         stdout=subprocess.PIPE, text=True)
    harness.wait_for(lambda: os.path.exists(ready), what="the relay to listen")
    with open(ready) as f:
        return p, f"tcp://127.0.0.1:{f.read().strip()}"


def relayed_consume(cluster, mode):
    prod, cons = cluster[0], cluster[1]
    produce(prod, "real.txt", "the real bytes")
    refused_before = prod.status()["counters"]["auth_refused"]
    relay, uri = start_relay(cluster, mode, prod, service_id=cons.name)
    p = cons.dyad("consume", cons.path("real.txt"), check=False,
                  env_extra={"DYAD_SERVICE_URI": uri, "DYAD_WAIT_TIMEOUT": 5})
    out, _ = relay.communicate(timeout=30)
    report = json.loads(out.strip().splitlines()[-1])
    return p, report, prod, refused_before


def assert_store_untouched(cluster):
    prod, cons = cluster[0], cluster[1]
    r = Raw.to(prod)
    f, _ = r.collect(r.request("kvs.get", ns="dyad", key="victim.txt"))
    assert f["type"] == ERROR, f  # no record was written by the relay
    # And the legitimate path still works end to end.
    cons.dyad("consume", cons.path("real.txt"), env_extra={"DYAD_WAIT_TIMEOUT": 20})
    with open(cons.path("real.txt")) as f:
        assert f.read() == "the real bytes"


def test_a_rewritten_relayed_hello_admits_nothing(cluster):
    # The relay passes the client's nonce on with role "service" and another
    # service's id. Before: the service's proof covered only the nonces, the
    # client accepted it and proved itself, and the relay was admitted as
    # that service and rewrote records. Now the proofs cover both hellos.
    p, report, prod, _ = relayed_consume(cluster, "rewrite")
    assert p.returncode != 0
    assert "could not prove it holds the job's key" in p.stderr, p.stderr
    assert not report["client_sent_proof"], report
    assert not report["admitted"], report
    assert_store_untouched(cluster)


def test_a_transparent_relay_is_seen_and_refused(cluster):
    # Every byte of the hello relayed as it is: the proofs verify, but the
    # service's view of the connection is the relay's, not the client's.
    p, report, prod, _ = relayed_consume(cluster, "transparent")
    assert p.returncode != 0
    assert "is relayed" in p.stderr, p.stderr
    assert not report["client_sent_proof"], report
    assert not report["admitted"], report
    assert_store_untouched(cluster)


def assert_dropped(r, what):
    """The service closes the connection without answering the last frame."""
    try:
        f = r.recv()
    except (ConnectionError, OSError):
        return
    raise AssertionError(f"{what} frame was answered: {f}")


def test_frames_cannot_be_injected_replayed_or_changed(cluster):
    prod = cluster[0]
    produce(prod, "tagged.txt", "x")
    before = prod.status()["counters"]["auth_refused"]
    # An admitted, keyed connection works with tags...
    r = Raw.to(prod)
    assert r.info["type"] == HELLO and r.tx is not None
    f, _ = r.collect(r.request("kvs.list", ns="dyad"))
    assert f["type"] == END, f
    # ...and a frame without its tag (injected) ends it.
    r.s.sendall(r.frame(REQUEST, 5, {"topic": "kvs.list", "ns": "dyad"})[:-16])
    r.s.sendall(b"\0" * 16)
    assert_dropped(r, "an untagged")
    # A replayed frame: the same bytes twice.
    r = Raw.to(prod)
    once = r.frame(REQUEST, 1, {"topic": "kvs.list", "ns": "dyad"})
    r.s.sendall(once)
    assert r.recv()["type"] == END
    r.s.sendall(once)
    assert_dropped(r, "a replayed")
    # A frame whose meta was changed after it was tagged.
    r = Raw.to(prod)
    good = r.frame(REQUEST, 1, {"topic": "kvs.list", "ns": "dyad"})
    r.s.sendall(good.replace(b'"dyad"', b'"dyaz"'))
    assert_dropped(r, "a changed")
    assert prod.status()["counters"]["auth_refused"] >= before + 3


def test_a_client_names_the_service_it_expects(cluster):
    prod = cluster[0]
    # Asking node0's port for another service id: refused by the service...
    r = Raw.to(prod, expect="someone-else")
    assert r.info["type"] == ERROR and "not the service the client expected" in r.info["meta"]["msg"]
    # ...and the right one is admitted.
    r = Raw.to(prod, expect=prod.name)
    assert r.info["type"] == HELLO


def test_a_hello_cannot_reserve_memory_before_admission(cluster):
    # Before: the service sized its buffer from the header's meta_len (up to
    # 1 MiB) as soon as the header arrived; 2,048 such headers took a keyed
    # dyadd from 38 MB to 2.1 GB. Now a frame before admission may carry
    # at most 4 KiB of meta.
    prod = cluster[0]
    rss0 = harness.rss_kib(prod.proc.pid)
    socks = []
    for _ in range(256):
        r = Raw.to(prod, hello=False)
        r.s.sendall(r.frame(HELLO, 0, b"", meta_len=1 << 20))
        socks.append(r)
    answered = 0
    for r in socks[:8]:
        f = r.recv()
        assert f["type"] == ERROR and "a hello may have at most 4096" in f["meta"]["msg"], f
        answered += 1
    grown = harness.rss_kib(prod.proc.pid) - rss0
    for r in socks:
        r.close()
    assert grown < 64 * 1024, f"dyadd grew by {grown} KiB for 256 hello headers"


# ---- the compact answers' data is covered by their tag (issue 45, finding 6) ----

class OnPath:
    """An on-path attacker the hello cannot see: four network namespaces,
    the client's (c) linked to the relay's front (f), the relay's back (b)
    linked to the service's (s); c and b are 10.99.0.1, f and s 10.99.0.2,
    so a client in c that connects to 10.99.0.2 and the service in s see
    the same two addresses (tamper.py). One keyed dyadd in s has produced
    8 files of one size (their index swapped, one would pass for another)."""

    PORT = 7627

    def __init__(self, root):
        self.root = root
        tag = str(os.getpid())
        self.ns = {m: f"dyadt-{tag}-{m}" for m in "cfbs"}
        self.procs = []
        try:
            for ns in self.ns.values():
                self.ip("netns", "add", ns)
            for a, b in (("c", "f"), ("b", "s")):
                ia, ib = f"dyt{tag}{a}", f"dyt{tag}{b}"
                self.ip("link", "add", ia, "type", "veth", "peer", "name", ib)
                for m, i, addr in ((a, ia, "10.99.0.1"), (b, ib, "10.99.0.2")):
                    self.ip("link", "set", i, "netns", self.ns[m])
                    self.ip("netns", "exec", self.ns[m], "ip", "addr", "add", f"{addr}/24", "dev", i)
                    self.ip("netns", "exec", self.ns[m], "ip", "link", "set", i, "up")
                    self.ip("netns", "exec", self.ns[m], "ip", "link", "set", "lo", "up")
            self.key = os.path.join(root, "job.key")
            subprocess.run([harness.DYAD, "keygen", self.key], check=True, capture_output=True)
            self.prod = os.path.join(root, "prod")
            self.cons = os.path.join(root, "cons")
            os.makedirs(os.path.join(self.prod, "c"))
            self.log = open(os.path.join(root, "dyadd.log"), "wb")
            self.dyadd = self.spawn("s", [harness.DYADD, "--node", "node0", "--listen", f"10.99.0.2:{self.PORT}",
                                          self.prod], stdout=self.log, stderr=subprocess.STDOUT)
            harness.wait_for(lambda: self.dyad("s", "service", "status", check=False).returncode == 0, 30,
                             what="the dyadd in its namespace to answer")
            self.names = [f"c/f{i}.bin" for i in range(8)]
            for i, n in enumerate(self.names):
                harness.write_file(os.path.join(self.prod, n), 3000, seed=i + 1)
            self.dyad("s", "produce", *[os.path.join(self.prod, n) for n in self.names])
        except BaseException:
            self.cleanup()
            raise

    @staticmethod
    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def env(self, **extra):
        e = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
        e.update({"DYAD_AUTH_KEY_FILE": self.key, "DYAD_SERVICE_URI": f"tcp://10.99.0.2:{self.PORT}",
                  "DYAD_PATH_PRODUCER": self.prod, "DYAD_PATH_CONSUMER": self.cons})
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def spawn(self, m, cmd, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[m], *cmd], env=self.env(), **kw)
        self.procs.append(p)
        return p

    def dyad(self, m, *args, check=True, **env):
        p = subprocess.run(["ip", "netns", "exec", self.ns[m], harness.DYAD, *args], env=self.env(**env),
                           capture_output=True, text=True, timeout=120)
        if check and p.returncode != 0:
            raise RuntimeError(f"dyad {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def relay(self, mode):
        """tamper.py's two halves, in f and b."""
        via = os.path.join(self.root, f"relay-{mode}.sock")
        tamper = os.path.join(HERE, "tamper.py")
        back = self.spawn("b", [sys.executable, tamper, mode, "back", "--via", via, "--service",
                                f"10.99.0.2:{self.PORT}", "--source", "10.99.0.1"], stdout=subprocess.PIPE, text=True)
        assert "listening" in back.stdout.readline()
        front = self.spawn("f", [sys.executable, tamper, mode, "front", "--listen", f"10.99.0.2:{self.PORT}",
                                 "--via", via], stdout=subprocess.PIPE, text=True)
        assert "listening" in front.stdout.readline()
        return front, back

    @staticmethod
    def changed(relay):
        """The number of frames the relay changed (it is stopped)."""
        for p in relay:
            p.kill()
        out, _ = relay[1].communicate(timeout=10)
        relay[0].communicate(timeout=10)
        return sum(1 for line in out.splitlines() if "tampered" in line)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def onpath(tmp_path):
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 (network namespaces)")
    o = OnPath(str(tmp_path))
    yield o
    o.cleanup()


CONSUME_ENV = {"DYAD_DTL_MODE": "FLUX_RPC", "DYAD_LOG_LEVEL": "debug", "DYAD_WAIT_TIMEOUT": 20}


@pytest.mark.parametrize("mode", ["fetch_many", "get_many"])
def test_a_changed_byte_in_a_compact_answer_fails_its_tag(onpath, mode):
    """kvs.get_many's compact answer carries the records in its data, and
    dyad.fetch_many's each file's index and XXH3 before its bytes: an
    on-path attacker that the hello cannot see (same addresses on both
    sides) and that changes one byte there made the consumer take file 0's
    bytes for file 1 (or a record of another size). The tag covers that
    part of the data now: the frame is refused, and the files come whole
    and right by the ways that are not compact."""
    relay = onpath.relay(mode)
    try:
        p = onpath.dyad("c", "consume", *[os.path.join(onpath.cons, n) for n in onpath.names], check=False,
                        **CONSUME_ENV)
    finally:
        changed = onpath.changed(relay)
    assert changed >= 1, "the relay saw no compact answer"
    assert p.returncode == 0, p.stderr[-3000:]
    for n in onpath.names:
        with open(os.path.join(onpath.prod, n), "rb") as want, open(os.path.join(onpath.cons, n), "rb") as got:
            assert got.read() == want.read(), n
    assert "failed its authentication tag" in p.stderr, p.stderr[-3000:]


def test_a_changed_byte_in_a_compact_list_fails_its_tag(onpath):
    """kvs.list's compact answer (dyad ls) carries the records in its data."""
    relay = onpath.relay("list")
    try:
        p = onpath.dyad("c", "ls", check=False)
    finally:
        changed = onpath.changed(relay)
    assert changed >= 1, "the relay saw no compact answer"
    assert p.returncode != 0 and "failed its authentication tag" in p.stderr, (p.returncode, p.stderr)
