# SPDX-License-Identifier: Apache-2.0
"""Where a dyadd listens, and that one id, one producer directory and one
Unix socket have one dyadd (issue 31, findings 6 and 7).

Every listener of a service (its TCP port, UCX's TCP interfaces, libfabric's
endpoint, the metrics endpoint) binds where its listen policy says: without a
key, loopback only. A second dyadd with the same --node on the same store,
the same producer directory or the same --socket is refused at start, and a
service killed with SIGKILL starts again."""
import ipaddress
import os
import signal
import socket
import subprocess

import pytest

import harness

BUILT = harness.built_transports()


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def listeners_of(pid):
    """(address, port) of every TCP socket of `pid` in LISTEN state."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table, width in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state != "0A" or inode not in inodes:
                    continue
                hexaddr, hexport = local.split(":")
                raw = bytes.fromhex(hexaddr)
                # /proc prints each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
                out.append((str(ipaddress.ip_address(raw)), int(hexport, 16)))
    return out


def assert_loopback_only(node):
    found = listeners_of(node.proc.pid)
    assert found, "no listener found (the test cannot see the service's sockets)"
    outside = [(a, p) for a, p in found
               if not ipaddress.ip_address(a).is_loopback
               and not (ipaddress.ip_address(a).version == 6
                        and ipaddress.ip_address(a).ipv4_mapped
                        and ipaddress.ip_address(a).ipv4_mapped.is_loopback)]
    assert not outside, f"{node.name} (pid {node.proc.pid}) listens outside loopback: {outside} (all: {found})"


@pytest.mark.skipif("UCX" not in BUILT, reason="this build has no UCX transport")
def test_keyless_dyadd_keeps_every_transport_listener_on_loopback():
    """A keyless dyadd with UCX (and libfabric, where built) moves files and
    has no listening socket outside loopback, before and after transfers."""
    env = {"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    with harness.Cluster(nodes=2, auth=False, env=env) as c:
        prod, cons = c[0], c[1]
        for n in c.nodes:
            assert_loopback_only(n)
        modes = ["UCX"] + (["MARGO"] if "MARGO" in BUILT else [])
        for mode in modes:
            name = f"via-{mode}.bin"
            harness.write_file(prod.path(name), (1 << 20) + 3, seed=5)
            prod.dyad("produce", prod.path(name))
            cons.dyad("consume", cons.path(name),
                      env_extra={"DYAD_DTL_MODE": mode, "DYAD_WAIT_TIMEOUT": 30, "DYAD_TRANSFER_TIMEOUT": 20})
            assert harness.sha256(cons.path(name)) == harness.sha256(prod.path(name))
            used = prod.status()["counters"]["per_transport"][mode]["requests"]
            assert used >= 1, f"{mode} was not used"
        for n in c.nodes:
            assert_loopback_only(n)


def start_dyadd(args, env=None, timeout=30):
    return subprocess.run([harness.DYADD, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env())


def test_second_dyadd_on_the_same_producer_directory_is_refused():
    with harness.Cluster(nodes=1, auth=False) as c:
        n = c[0]
        p = start_dyadd(["--node", "other", "--listen", f"127.0.0.1:{harness.free_port()}", n.dir])
        assert p.returncode == 1, p.stderr
        assert os.path.realpath(n.dir) in p.stderr, p.stderr
        assert f"pid {n.proc.pid}" in p.stderr and "node0" in p.stderr, p.stderr
        assert "stop it first" in p.stderr, p.stderr
        # the first one still serves
        harness.write_file(n.path("still.txt"), 100, seed=1)
        n.dyad("produce", n.path("still.txt"))


def test_second_dyadd_with_the_same_service_id_is_refused(tmp_path):
    with harness.Cluster(nodes=2, auth=False) as c:
        other = str(tmp_path / "elsewhere")
        p = start_dyadd(["--node", "node1", "--listen", f"127.0.0.9:{harness.free_port('127.0.0.9')}",
                         "--kvs", c[0].uri, other])
        assert p.returncode == 1, p.stderr
        assert "'node1'" in p.stderr and c[1].uri in p.stderr, p.stderr
        assert "--node" in p.stderr, p.stderr
        # The store's own id too.
        p = start_dyadd(["--node", "node0", "--listen", f"127.0.0.9:{harness.free_port('127.0.0.9')}",
                         "--kvs", c[0].uri, other])
        assert p.returncode == 1 and "'node0'" in p.stderr, p.stderr
        # node1 still serves: its registration was not replaced
        assert c[1].status()["service_id"] == "node1"
        harness.write_file(c[1].path("a.txt"), 10, seed=2)
        c[1].dyad("produce", c[1].path("a.txt"))
        c[0].dyad("consume", c[0].path("a.txt"), env_extra={"DYAD_WAIT_TIMEOUT": 20})


def test_a_killed_service_starts_again_with_its_id_and_directory():
    """A lock of a dead process is gone, and a registration nobody answers
    for is stale: neither blocks the restart."""
    with harness.Cluster(nodes=2, auth=False) as c:
        c[1].kill()
        c[1].start()
        assert c[1].status()["service_id"] == "node1"
        c[0].kill()  # the store's host: its own directory lock
        c[0].start()


def test_a_live_unix_socket_is_not_taken_over(tmp_path):
    with harness.Cluster(nodes=1, auth=False) as c:
        n = c[0]
        assert n.socket
        p = start_dyadd(["--node", "x", "--listen", "", "--socket", n.socket, str(tmp_path / "p")])
        assert p.returncode == 1, p.stderr
        assert n.socket in p.stderr and "another dyadd" in p.stderr, p.stderr
        # the socket is still the first one's
        assert n.dyad("service", "status", env_extra={"DYAD_SERVICE_URI": n.unix_uri}).returncode == 0


AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runs a client as nobody)")


@needs_root
def test_socket_mode_follows_allow_uid():
    """--allow-uid any: every user can connect to the socket (it was 0755:
    EACCES for all but root); without it, only dyadd's user and root."""
    with harness.Cluster(nodes=1, start=False, auth=False) as c:
        node = c[0]
        os.chmod(c.root, 0o755)
        node.start(["--allow-uid", "any"])
        assert os.stat(node.socket).st_mode & 0o777 == 0o666
        env = node.env(DYAD_SERVICE_URI=node.unix_uri)
        p = subprocess.run(AS_NOBODY + [harness.DYAD, "service", "status"], capture_output=True, text=True,
                           env=env, timeout=30)
        assert p.returncode == 0, p.stderr
        node.stop()
        node.start()
        assert os.stat(node.socket).st_mode & 0o777 == 0o600


@needs_root
def test_a_consumer_refused_the_socket_falls_back_to_tcp():
    """A same-node consumer steered to its owner's Unix socket, which it may
    not use, fetches over TCP with a note instead of failing."""
    with harness.Cluster(nodes=1, start=False, auth=False) as c:
        node = c[0]
        os.chmod(c.root, 0o755)
        node.start()
        os.chmod(node.socket, 0o600)  # what the default policy means (root's dyadd)
        cdir = os.path.join(c.root, "nobody")
        os.mkdir(cdir)
        os.chown(cdir, 65534, 65534)
        harness.write_file(node.path("shared.bin"), 5000, seed=3)
        os.chmod(node.path("shared.bin"), 0o644)
        node.dyad("produce", node.path("shared.bin"))
        env = node.env(producer=False, consumer=False, DYAD_PATH_CONSUMER=cdir, DYAD_WAIT_TIMEOUT=20)
        p = subprocess.run(AS_NOBODY + [harness.DYAD, "consume", os.path.join(cdir, "shared.bin")],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "cannot use the Unix socket" in p.stderr and node.uri in p.stderr, p.stderr
        assert harness.sha256(os.path.join(cdir, "shared.bin")) == harness.sha256(node.path("shared.bin"))


def test_failed_requests_do_not_flood_the_log():
    """One connection sending failing requests as fast as it can: every
    failure is counted, at most a few lines reach the log (it was one line
    per request: ~2.7 MB/s from one connection)."""
    from rawwire import ERROR, REQUEST, Raw
    with harness.Cluster(nodes=1, auth=False) as c:
        node = c[0]
        r = Raw.to(node)
        n, batch = 400, 40
        errors = 0
        for first in range(1, n + 1, batch):
            for tag in range(first, first + batch):
                r.send(REQUEST, tag, {"topic": "dyad.fetch", "upath": "../outside", "transport": "FLUX_RPC"})
            while errors < first + batch - 1:
                errors += r.recv()["type"] == ERROR
        r.close()
        with open(node.log_path, errors="replace") as f:
            lines = [line for line in f if "request failed" in line]
        assert 1 <= len(lines) <= 25, f"{len(lines)} lines of failed requests in the log"
        assert node.status()["counters"]["errors"] >= n


def test_a_keyless_service_serves_a_user_only_what_it_could_read():
    """Without a key, a local user's consumer is served only files its uid
    could read itself: root's dyadd handed a 0600 file of root to any local
    client (it was documented only as "loopback is open")."""
    with harness.Cluster(nodes=1, start=False, auth=False) as c:
        node = c[0]
        os.chmod(c.root, 0o755)
        node.start()
        cdir = os.path.join(c.root, "nobody")
        os.mkdir(cdir)
        os.chown(cdir, 65534, 65534)
        for name, mode in (("secret.bin", 0o600), ("open.bin", 0o644)):
            harness.write_file(node.path(name), 5000, seed=4)
            os.chmod(node.path(name), mode)
            node.dyad("produce", node.path(name))
        env = node.env(producer=False, consumer=False, DYAD_PATH_CONSUMER=cdir, DYAD_WAIT_TIMEOUT=10,
                       DYAD_SERVICE_URI=node.uri)

        def consume(name):
            return subprocess.run(AS_NOBODY + [harness.DYAD, "consume", os.path.join(cdir, name)],
                                  capture_output=True, text=True, env=env, timeout=60)
        p = consume("secret.bin")
        assert p.returncode != 0, p.stderr
        assert "is not readable by uid 65534" in p.stderr, p.stderr
        assert not os.path.exists(os.path.join(cdir, "secret.bin"))
        p = consume("open.bin")
        assert p.returncode == 0, p.stderr
        assert harness.sha256(os.path.join(cdir, "open.bin")) == harness.sha256(node.path("open.bin"))
        assert node.status()["counters"]["refused_unreadable"] >= 1
        # The service's own uid (root here) is served as before.
        node.dyad("consume", node.path("secret.bin"), check=False)
