# SPDX-License-Identifier: Apache-2.0
"""Bad input gets a clear error, the service keeps serving, waits have deadlines."""
import json
import os
import signal
import subprocess
import time

import pytest

import harness
from rawwire import END, ERROR, VERSION, Raw


def fetch(node, upath):
    r = Raw.to(node)
    tag = r.request("dyad.fetch", upath=upath, transport="FLUX_RPC")
    f, data = r.collect(tag)
    r.close()
    return f, data


def assert_still_serving(node):
    with open(node.path("alive.txt"), "w") as f:
        f.write("alive")
    node.dyad("produce", node.path("alive.txt"))
    f, data = fetch(node, "alive.txt")
    assert f["type"] == END and data == b"alive"


@pytest.mark.parametrize("upath,errnum,words", [
    ("../x", 22, "'..'"),
    ("sub/../../x", 22, "'..'"),
    ("/etc/passwd", 22, "absolute"),
    ("missing.bin", 2, "no file"),
    ("adir", 21, "directory"),
    ("escape", 13, "outside"),
    ("", 22, "empty"),
])
def test_fetch_refusals(cluster, upath, errnum, words):
    prod = cluster[0]
    os.makedirs(prod.path("adir"), exist_ok=True)
    outside = os.path.join(cluster.root, "secret.txt")
    with open(outside, "w") as f:
        f.write("secret")
    if not os.path.lexists(prod.path("escape")):
        os.symlink(outside, prod.path("escape"))
    f, data = fetch(prod, upath)
    assert f["type"] == ERROR
    assert f["errnum"] == errnum, f
    assert words in f["meta"]["msg"], f["meta"]["msg"]
    assert data == b""
    assert_still_serving(prod)


def test_unknown_transport_and_topic(cluster):
    r = Raw.to(cluster[0])
    f, _ = r.collect(r.request("dyad.fetch", upath="x", transport="PIGEON"))
    assert f["type"] == ERROR and "PIGEON" in f["meta"]["msg"]
    f, _ = r.collect(r.request("no.such"))
    assert f["type"] == ERROR and f["errnum"] == 38
    assert_still_serving(cluster[0])


def test_other_wire_version_is_told_why(cluster):
    r = Raw.to(cluster[0], version=7, hello=False)
    r.send(1, 0, {"version": 7})
    f = r.recv()
    assert f["type"] == ERROR
    assert "version 7" in f["meta"]["msg"]
    assert_still_serving(cluster[0])


def test_garbage_connection_does_not_hurt_service(cluster):
    import socket
    s = socket.create_connection((cluster[0].host, cluster[0].port))
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10)
    s.close()
    assert_still_serving(cluster[0])


def test_wait_timeout_two_seconds(cluster):
    cons = cluster[1]
    t0 = time.monotonic()
    p = cons.dyad("consume", cons.path("never.bin"), check=False, env_extra={"DYAD_WAIT_TIMEOUT": 2})
    dt = time.monotonic() - t0
    assert p.returncode == 3, p.stderr
    assert "never.bin" in p.stderr and "DYAD_WAIT_TIMEOUT" in p.stderr
    # The deadline held: not before it, and no hang after it (a loaded CI
    # machine may be slow to start and stop the process).
    assert 1.9 <= dt < 15, dt
    assert not os.path.exists(cons.path("never.bin"))
    # The abandoned wait left nothing behind in the store.
    assert cluster[0].status()["store"]["waiters"] == 0


def test_timeout_option_overrides_env(cluster):
    cons = cluster[1]
    t0 = time.monotonic()
    p = cons.dyad("consume", "--timeout", "0.5", cons.path("never.bin"), check=False)
    assert p.returncode == 3
    assert time.monotonic() - t0 < 2.5


def test_produced_then_deleted_file_is_a_clear_error(cluster):
    prod, cons = cluster[0], cluster[1]
    harness.write_file(prod.path("gone.bin"), 1000)
    prod.dyad("produce", prod.path("gone.bin"))
    os.unlink(prod.path("gone.bin"))
    p = cons.dyad("consume", cons.path("gone.bin"), check=False, env_extra={"DYAD_WAIT_TIMEOUT": 5})
    assert p.returncode == 2, p.stderr
    assert "gone.bin" in p.stderr and "no file" in p.stderr
    assert not os.path.exists(cons.path("gone.bin"))


def test_cli_errors_name_the_problem(cluster):
    prod, cons = cluster[0], cluster[1]
    p = prod.dyad("produce", "/etc/hostname", check=False)
    assert p.returncode == 2 and "not inside the producer directory" in p.stderr
    p = prod.dyad("produce", prod.path("nope.bin"), check=False)
    assert p.returncode == 2 and "nope.bin" in p.stderr
    p = cons.dyad("consume", cons.path("x"), check=False, env_extra={"DYAD_SERVICE_URI": "tcp://127.0.0.1:1"})
    assert p.returncode == 4 and "start dyadd" in p.stderr
    # A boolean that is neither on nor off is on, as in DYAD, and said so.
    p = cons.dyad("consume", cons.path("x"), check=False,
                  env_extra={"DYAD_SHARED_STORAGE": "maybe", "DYAD_WAIT_TIMEOUT": 1})
    assert p.returncode == 3 and "DYAD_SHARED_STORAGE='maybe'" in p.stderr and "taken as on" in p.stderr
    # A transport name that does not exist: the valid ones are listed.
    p = cons.dyad("consume", cons.path("x"), check=False, env_extra={"DYAD_DTL_MODE": "RDMA", "DYAD_WAIT_TIMEOUT": 1})
    assert p.returncode == 1 and "RDMA" in p.stderr and "LOCAL or AUTO" in p.stderr
    # A producer whose directory is not the one its service serves.
    p = subprocess.run([harness.DYAD, "produce", cons.path("f")], capture_output=True, text=True,
                       env=cons.env(DYAD_SERVICE_URI=prod.uri))
    assert p.returncode == 1 and "not the directory" in p.stderr


def test_paths_that_are_not_utf8_are_refused_clearly(cluster):
    """A file name in Latin-1 (not UTF-8): refused with a message that shows
    it, by the producer and by a consumer of several files, whose other
    files still arrive; no process dies (nlohmann's dump would throw)."""
    prod, cons = cluster[0], cluster[1]
    bad = b"caf\xe9.bin"
    with open(os.path.join(prod.dir.encode(), bad), "wb") as f:
        f.write(b"x" * 100)
    harness.write_file(prod.path("good.bin"), 1000)
    prod.dyad("produce", prod.path("good.bin"))

    def run(node, *args):
        return subprocess.run([harness.DYAD.encode(), *args], env=node.env(DYAD_WAIT_TIMEOUT=5),
                              capture_output=True, timeout=60)

    p = run(prod, b"produce", os.path.join(prod.dir.encode(), bad))
    assert p.returncode == 2, p.stderr
    assert b"'caf\\xE9.bin' is not UTF-8" in p.stderr, p.stderr
    for args in ([b"consume"], [b"--json", b"consume"]):
        p = run(cons, *args, cons.path("good.bin").encode(), os.path.join(cons.dir.encode(), bad))
        assert p.returncode == 2, p.stderr
        assert b"is not UTF-8" in p.stderr and b"rename it" in p.stderr, p.stderr
        assert harness.sha256(cons.path("good.bin")) == harness.sha256(prod.path("good.bin"))
        os.unlink(cons.path("good.bin"))
    assert_still_serving(prod)


def test_key_generation_vectors(cluster):
    n = cluster[0]
    assert n.dyad("key", "1/data0.txt").stdout.strip() == "263.2ce.2e1.1/data0.txt"
    assert n.dyad("key", "data0.txt").stdout.strip() == "17f.204.15b.data0.txt"
    out = n.dyad("key", "test_string", env_extra={"DYAD_KEY_BINS": 5}).stdout.strip()
    assert out == "2.0.2.test_string"


def test_sigterm_stops_cleanly(cluster):
    assert cluster[1].stop(signal.SIGTERM) == 0
    assert cluster[0].stop(signal.SIGTERM) == 0


def test_malformed_fields_do_not_kill_the_service(cluster):
    prod = cluster[0]
    r = Raw.to(prod)
    for topic, args in [("kvs.get", {"ns": "n", "key": "k", "wait": 1}),
                        ("kvs.list", {"ns": "n", "prefix": 5}),
                        ("dyad.fetch", {"upath": 5}),
                        ("dyad.fetch", {"upath": "x", "transport": 3}),
                        ("kvs.put", {"ns": "n", "key": "k", "value": 1}),
                        ("dyad.status", {"timeout_ms": "5"})]:
        f, _ = r.collect(r.request(topic, **args))
        assert f["type"] in (ERROR, END), (topic, f)
    assert prod.proc.poll() is None
    assert_still_serving(prod)


def test_consumer_that_stops_reading_is_dropped(cluster):
    """The service abandons a transfer nobody reads (and so frees the file's lock)."""
    prod = cluster[0]
    cluster[1].stop()  # its service keeps a connection to the store (prod) otherwise
    prod.stop()
    prod.start(["--send-timeout", "1"])
    harness.write_file(prod.path("big.bin"), 128 << 20)
    prod.dyad("produce", prod.path("big.bin"))
    stalled = Raw.to(prod)
    stalled.request("dyad.fetch", upath="big.bin", transport="FLUX_RPC")
    stalled.s.recv(1)
    st = prod.wait_status(lambda s: s["counters"]["errors"], "the stalled transfer to end in an error", timeout=10)
    errors = st["counters"]["errors"]
    assert errors == 1
    assert prod.status()["connections"] == 1  # only the status query itself
    stalled.close()


def test_deeply_nested_json_is_refused_not_fatal(cluster):
    prod = cluster[0]
    for typ in (1, 2):  # as a hello, then as a request after a proper hello
        r = Raw.to(prod, hello=(typ == 2))
        s = r.s
        meta = b"[" * 400000 + b"]" * 400000
        s.sendall(r.frame(typ, 1, meta))
        s.settimeout(5)
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
        s.close()
    assert prod.proc.poll() is None
    assert_still_serving(prod)


def test_client_frames_with_data_are_refused(cluster):
    prod = cluster[0]
    r = Raw.to(prod)
    r.s.sendall(__import__("struct").pack("<IHBBIiII", 0x44415944, VERSION, 2, 0, 5, 0, 0, 64 << 20))
    f = r.recv()
    assert f["type"] == ERROR and "no data" in f["meta"]["msg"]
    assert prod.proc.poll() is None
    assert_still_serving(prod)


def test_locked_file_waits_without_starving_other_transfers(cluster):
    """A producer rewriting a file holds an exclusive lock: fetches of that file
    wait (more of them than the service has file threads) while other files
    keep flowing; when the lock goes, the waiting fetches complete."""
    import fcntl
    prod, cons = cluster[0], cluster[1]
    harness.write_file(prod.path("locked.bin"), 1 << 20, seed=1)
    harness.write_file(prod.path("free.bin"), 1 << 20, seed=2)
    prod.dyad("produce", prod.path("free.bin"), prod.path("locked.bin"))
    holder = open(prod.path("locked.bin"), "r+b")
    fcntl.lockf(holder, fcntl.LOCK_EX)
    before = prod.status()["counters"]["requests"]
    waiting = []
    for _ in range(8):  # the service has 4 file threads
        r = Raw.to(prod)
        waiting.append((r, r.request("dyad.fetch", upath="locked.bin", transport="FLUX_RPC")))
    # The service has all 8 (counted as they arrive, then queued to the file
    # threads ahead of any later fetch).
    prod.wait_status(lambda s: s["counters"]["requests"] >= before + 8, "the 8 fetches of the locked file")
    t0 = time.monotonic()
    p = cons.dyad("consume", cons.path("free.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 10})
    assert p.returncode == 0 and time.monotonic() - t0 < 3
    fcntl.lockf(holder, fcntl.LOCK_UN)
    holder.close()
    for r, tag in waiting:
        f, data = r.collect(tag)
        assert f["type"] == END and len(data) == 1 << 20
        r.close()


def test_sigterm_with_fetches_waiting_on_a_lock(cluster):
    import fcntl
    prod = cluster[0]
    harness.write_file(prod.path("locked.bin"), 1000)
    prod.dyad("produce", prod.path("locked.bin"))
    holder = open(prod.path("locked.bin"), "r+b")
    fcntl.lockf(holder, fcntl.LOCK_EX)
    before = prod.status()["counters"]["requests"]
    rs = [Raw.to(prod) for _ in range(6)]
    for r in rs:
        r.request("dyad.fetch", upath="locked.bin", transport="FLUX_RPC")
    prod.wait_status(lambda s: s["counters"]["requests"] >= before + 6, "the 6 fetches of the locked file")
    t0 = time.monotonic()
    assert prod.stop(signal.SIGTERM, timeout=10) == 0
    assert time.monotonic() - t0 < 5
    holder.close()


def test_a_dyadd_with_another_key_says_the_key_files_differ_and_the_rank_says_where_it_came_from():
    """Issue 34, item 9: a dyadd whose key differs from the store host's was
    told "(is the dyadd hosting it running?)"; a rank the store gave read
    "rank 1 (store)", as if that node hosted the store."""
    with harness.Cluster(nodes=2) as c:
        with open(c[1].log_path, errors="replace") as f:
            log = f.read()
        assert "rank 1, assigned by the store" in log, log
        c[1].stop()
        other = os.path.join(c.root, "other.key")
        subprocess.run([harness.DYAD, "keygen", other], check=True, capture_output=True)
        c[1].extra_env["DYAD_AUTH_KEY_FILE"] = other
        with pytest.raises(RuntimeError):
            c[1].start()
        with open(c[1].log_path, errors="replace") as f:
            log = f.read()
        assert "is the dyadd hosting it running?" not in log, log
        assert "key file" in log and "differ" in log, log
