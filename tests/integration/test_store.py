# SPDX-License-Identifier: Apache-2.0
"""The embedded metadata store across restarts of its dyadd (generations
never repeat, services come back on their own, waiting consumers ride
through), listing in pages, and stat/ls from a node with one directory."""
import json
import os
import signal
import socket
import subprocess
import time

import harness
import pytest

GEN_BITS = 32  # generation = (epoch << 32) | count (docs/design.md)


def stat(node, path, **env):
    return json.loads(node.dyad("--json", "stat", path, env_extra=env).stdout)


def consume(node, path):
    p = node.dyad("--json", "consume", path, env_extra={"DYAD_WAIT_TIMEOUT": 60})
    return json.loads(p.stdout)


def restart(node):
    assert node.stop() == 0
    node.start()


def test_generations_never_repeat_after_a_restart_of_the_store_host(cluster):
    host, cons = cluster[0], cluster[1]
    src = host.path("same.bin")
    harness.write_file(src, 5000, seed=3)
    st = os.stat(src)
    host.dyad("produce", src)
    first = stat(cons, cons.path("same.bin"))
    assert first["generation"] >> GEN_BITS == 0
    assert host.status()["store"]["epoch"] == 0
    assert consume(cons, cons.path("same.bin"))["action"] == "fetched"
    assert consume(cons, cons.path("same.bin"))["action"] == "present"

    restart(host)
    assert host.status()["store"]["epoch"] == 1
    # The same bytes with the same mtime (as after cp -p), produced again.
    harness.write_file(src, 5000, seed=3)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    host.dyad("produce", src)
    again = stat(cons, cons.path("same.bin"))
    assert again["generation"] >> GEN_BITS == 1 and again["generation"] != first["generation"]
    assert again["size"] == first["size"] and again["mtime_ns"] == first["mtime_ns"]
    # The consumer's copy is of the earlier generation: fetched again.
    assert consume(cons, cons.path("same.bin"))["action"] == "fetched"
    assert consume(cons, cons.path("same.bin"))["action"] == "present"
    # The epoch lives in the state directory (default: PRODUCER_DIR/.dyad).
    with open(os.path.join(host.dir, ".dyad", "store-epoch")) as f:
        assert f.read().strip() == "2"


def test_state_dir_option_holds_the_epoch(tmp_path):
    with harness.Cluster(nodes=1, start=False) as c:
        node = c[0]
        state = str(tmp_path / "state")
        for expected in (0, 1):
            node.start(["--state-dir", state])
            assert node.status()["store"]["epoch"] == expected
            assert node.status()["store"]["state_dir"] == state
            assert node.stop() == 0
        assert not os.path.exists(os.path.join(node.dir, ".dyad", "store-epoch"))


def test_unusable_epoch_file_stops_the_start_and_says_why(tmp_path):
    with harness.Cluster(nodes=1, start=False) as c:
        node = c[0]
        state = tmp_path / "state"
        state.mkdir()
        (state / "store-epoch").write_text("not a number\n")
        node.log_path = str(tmp_path / "dyadd.log")
        try:
            node.start(["--state-dir", str(state)])
        except RuntimeError:
            pass
        assert node.proc.wait(timeout=30) != 0
        log = open(node.log_path).read()
        assert str(state / "store-epoch") in log and "does not hold a number" in log, log
        node.proc = None


def test_services_rejoin_and_publish_again_when_the_store_host_comes_back(cluster3):
    meta, prod, cons = cluster3[0], cluster3[1], cluster3[2]
    for name in ("a.bin", "sub/b.bin"):
        harness.write_file(prod.path(name), 3000, seed=len(name))
        prod.dyad("produce", prod.path(name))
    # Changed after it was published: not published again (never served).
    harness.write_file(prod.path("changed.bin"), 100)
    prod.dyad("produce", prod.path("changed.bin"))
    harness.write_file(prod.path("changed.bin"), 200)
    ms = prod.status()["metadata_store"]
    assert ms["backend"] == "remote embedded" and ms["endpoint"] == meta.uri and ms["reachable"]
    assert ms["rejoined"] == 0

    restart(meta)
    st = prod.wait_status(lambda s: s["metadata_store"]["rejoined"] >= 1, "registered again")
    assert st["metadata_store"]["republished"] == 2
    # The registry and the records are back, with generations of the new epoch.
    rec = stat(cons, cons.path("sub/b.bin"))
    assert rec["owner"] == "node1" and rec["generation"] >> GEN_BITS == 1
    assert consume(cons, cons.path("a.bin"))["action"] == "fetched"
    assert consume(cons, cons.path("sub/b.bin"))["action"] == "fetched"
    p = cons.dyad("stat", cons.path("changed.bin"), check=False)
    assert p.returncode == 2, p.stderr
    # dyad service status says which store, where, and that it answers.
    out = prod.dyad("service", "status").stdout
    assert f"metadata store: remote embedded at {meta.uri}, reachable" in out, out
    assert "registered again 1 times after the store came back empty, 2 records published again" in out, out
    out = meta.dyad("service", "status").stdout
    assert f"metadata store: embedded at {meta.uri}, reachable" in out, out
    assert ", epoch 1\n" in out, out


def test_status_says_when_the_store_host_is_down(cluster):
    host, other = cluster[0], cluster[1]
    assert host.stop() == 0
    st = other.wait_status(lambda s: not s["metadata_store"]["reachable"], "store unreachable")
    assert st["metadata_store"]["backend"] == "remote embedded"
    assert host.uri in st["metadata_store"]["error"]
    out = other.dyad("service", "status").stdout
    assert f"metadata store: remote embedded at {host.uri}, NOT reachable" in out, out
    host.start()
    other.wait_status(lambda s: s["metadata_store"]["reachable"] and s["metadata_store"]["rejoined"] >= 1,
                      "store reachable again")


def test_waiting_consumer_rides_through_a_restart_of_the_store_host(cluster3):
    meta, prod, cons = cluster3[0], cluster3[1], cluster3[2]
    consumer = cons.dyad_async("--json", "consume", cons.path("late.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 120})
    assert cons.wait_waiters(1, procs=[consumer]) is not None, consumer.communicate()
    restart(meta)
    # The consumer waits again in the new store (the producer's service too
    # comes back, and its publish wakes the consumer).
    assert cons.wait_waiters(1, procs=[consumer]) is not None, consumer.communicate()
    prod.wait_status(lambda s: s["metadata_store"]["rejoined"] >= 1, "registered again")
    harness.write_file(prod.path("late.bin"), 4096, seed=9)
    prod.dyad("produce", prod.path("late.bin"))
    out, err = consumer.communicate(timeout=120)
    assert consumer.returncode == 0, err
    assert json.loads(out)["action"] == "fetched"
    assert "lost while waiting" in err, err
    assert harness.sha256(cons.path("late.bin")) == harness.sha256(prod.path("late.bin"))


def test_ls_lists_ten_thousand_records_in_pages(cluster):
    host, cons = cluster[0], cluster[1]
    n = 10000
    os.makedirs(host.path("many/deep"), exist_ok=True)
    names = [f"many/{i:05d}.dat" if i % 10 else f"many/deep/{i:05d}.dat" for i in range(n)]
    for name in names:
        with open(host.path(name), "w") as f:
            f.write(name)
    for i in range(0, n, 500):
        host.dyad("produce", *[host.path(x) for x in names[i:i + 500]])
    p = cons.dyad("--json", "ls")
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(rows) == n
    assert sorted(r["path"] for r in rows) == sorted(names)
    # PREFIX selects by relative path.
    deep = [json.loads(line) for line in cons.dyad("--json", "ls", "many/deep/").stdout.splitlines()]
    assert sorted(r["path"] for r in deep) == sorted(x for x in names if x.startswith("many/deep/"))
    assert cons.dyad("ls", "nothing/").stdout == ""
    # Text output: one line per file.
    assert len(cons.dyad("ls").stdout.splitlines()) == n


def test_ls_prefix_with_unhashed_keys(cluster):
    # DYAD_KEY_DEPTH=0: the key is the relative path, the store selects.
    prod, cons = cluster[0], cluster[1]
    flat = {"DYAD_KEY_DEPTH": 0}
    for name in ("r1/a", "r1/b", "r2/a"):
        harness.write_file(prod.path(name), 10)
        prod.dyad("produce", prod.path(name), env_extra=flat)
    rows = cons.dyad("--json", "ls", "r1/", env_extra=flat).stdout.splitlines()
    assert [json.loads(r)["path"] for r in rows] == ["r1/a", "r1/b"]


def test_stat_and_ls_from_a_node_with_one_directory(cluster):
    prod, cons = cluster[0], cluster[1]
    harness.write_file(prod.path("one/f.bin"), 1234)
    prod.dyad("produce", prod.path("one/f.bin"))
    only_producer = {"producer": True, "consumer": False}
    only_consumer = {"producer": False, "consumer": True}
    # Only a producer directory: stat a produced file by its producer path.
    st = json.loads(prod.dyad("--json", "stat", prod.path("one/f.bin"), env_extra=only_producer).stdout)
    assert st["path"] == "one/f.bin" and st["size"] == 1234
    rows = prod.dyad("--json", "ls", env_extra=only_producer).stdout.splitlines()
    assert [json.loads(r)["path"] for r in rows] == ["one/f.bin"]
    # Only a consumer directory (on another node).
    st = json.loads(cons.dyad("--json", "stat", cons.path("one/f.bin"), env_extra=only_consumer).stdout)
    assert st["path"] == "one/f.bin" and st["owner"] == "node0"
    rows = cons.dyad("--json", "ls", "one/", env_extra=only_consumer).stdout.splitlines()
    assert [json.loads(r)["path"] for r in rows] == ["one/f.bin"]
    # A path in neither directory names the ones that are set.
    p = cons.dyad("stat", "/elsewhere/f.bin", check=False, env_extra=only_consumer)
    assert p.returncode != 0 and "not inside the consumer directory" in p.stderr, p.stderr
    p = prod.dyad("stat", "/elsewhere/f.bin", check=False, env_extra=only_producer)
    assert p.returncode != 0 and "not inside the producer directory" in p.stderr, p.stderr


def test_the_port_refuses_connections_until_the_service_is_registered(tmp_path):
    """dyadd binds its port at once but listens only once it is registered
    and ready: whoever can connect is served. Here its store is a socket
    that accepts and never answers, so the registration waits and fails
    (exit 4); until then every connection to dyadd's port is refused."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    with harness.Cluster(nodes=1, start=False) as c:
        node = c[0]
        args = [harness.DYADD, "--node", node.name, "--listen", f"{node.host}:{node.port}", node.dir,
                "--kvs", f"tcp://127.0.0.1:{hole.getsockname()[1]}"] + c.dyadd_args
        with open(tmp_path / "dyadd.log", "wb") as log:
            node.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        accepted, tries = 0, 0
        end = time.monotonic() + 3
        while time.monotonic() < end and node.proc.poll() is None:
            tries += 1
            try:
                socket.create_connection((node.host, node.port), timeout=1).close()
                accepted += 1
            except ConnectionRefusedError:
                pass
            time.sleep(0.05)
        assert tries > 10 and accepted == 0, (tries, accepted)
        assert node.proc.wait(timeout=60) == 4
        node.proc = None
        assert "cannot register in the metadata store" in (tmp_path / "dyadd.log").read_text()
    hole.close()


def _put_until_refused(node, ns_of, most, on_batch):
    """kvs.put of tiny records as a service (a raw client holding the key),
    500 at a time, until one is refused or `most` were sent; on_batch() runs
    after each batch. Returns (stored, first refusal)."""
    from rawwire import ERROR, REQUEST, Raw
    r = Raw.to(node, role="service", service_id="greedy")
    value = json.dumps({"owner": "greedy"})
    stored, i = 0, 0
    while i < most:
        tags = []
        for _ in range(500):
            r.tag += 1
            r.send(REQUEST, r.tag, {"topic": "kvs.put", "ns": ns_of(i), "key": f"k{i}", "value": value})
            tags.append(r.tag)
            i += 1
        refused = None
        for _ in tags:
            f = r.recv()
            if f["type"] == ERROR:
                refused = refused or f
            else:
                stored += 1
        if refused:
            return stored, refused
        on_batch()
    return stored, None


def test_store_max_bounds_the_memory_tiny_records_take():
    """Issue 31, finding 6: --store-max counted only keys and values, so
    470,000 tiny records in an 8 MB store added 66 MB of RSS. It now counts
    what each record costs: the store is full before dyadd grows far past it."""
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start(["--store-max", "4M"])
        pid = node.proc.pid
        base = harness.rss_kib(pid)
        limit_kib = 3 * 4 * 1024  # three times the cap: allocator slack, not 15x

        def rss_bounded():
            grown = harness.rss_kib(pid) - base
            assert grown < limit_kib, f"dyadd grew by {grown} KiB with --store-max 4M and the store not full yet"

        stored, refused = _put_until_refused(node, lambda i: "tiny", 400000, rss_bounded)
        rss_bounded()
        assert refused is not None, f"{stored} records and still not full"
        msg = refused["meta"]["msg"]
        assert "metadata store is full" in msg and "--store-max" in msg, msg
        st = node.status()["store"]
        assert st["bytes"] <= st["max_bytes"] == 4 << 20, st
        assert st["refused_store_full"] >= 1, st
        assert 10000 < stored < 30000, stored  # ~210 bytes charged per tiny record
    finally:
        c.cleanup()


def test_the_number_of_namespaces_is_capped():
    """Issue 31, finding 6: each namespace costs memory of its own; one
    more than --store-max-namespaces is refused with a clear error."""
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start(["--store-max-namespaces", "20"])
        # The service's own namespace ("dyad") is one of them.
        stored, refused = _put_until_refused(node, lambda i: f"ns{i}", 500, lambda: None)
        assert refused is not None
        msg = refused["meta"]["msg"]
        assert "namespaces" in msg and "--store-max-namespaces" in msg, msg
        assert 18 <= stored <= 20, stored
        st = node.status()["store"]
        assert st["refused_namespaces"] >= 1 and st["namespaces"] <= 20, st
    finally:
        c.cleanup()


def ls(node):
    rows = [json.loads(line) for line in node.dyad("--json", "ls").stdout.splitlines()]
    return {r["path"]: r for r in rows}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_store_host_publishes_its_own_files_again_after_a_restart(cluster, sig):
    """docs/design.md, "The embedded store across restarts": the host's own
    records come back (its durable ledger), the other services' too (their
    re-join); a file changed or removed while the host was down is not
    listed nor served with its old record; a waiting consumer finishes."""
    host, other = cluster[0], cluster[1]
    mine = [f"h/{i:03d}.bin" if i % 4 else f"h/sub/{i:03d}.bin" for i in range(40)]
    theirs = [f"o/{i:03d}.bin" for i in range(10)]
    for i, name in enumerate(mine + ["h/changed.bin", "h/gone.bin", "h/touched.bin"]):
        harness.write_file(host.path(name), 100 + 37 * i, seed=i)
    host.dyad("produce", *[host.path(n) for n in mine + ["h/changed.bin", "h/gone.bin", "h/touched.bin"]])
    for i, name in enumerate(theirs):
        harness.write_file(other.path(name), 3000 + i, seed=100 + i)
    other.dyad("produce", *[other.path(n) for n in theirs])
    before = ls(other)
    assert len(before) == len(mine) + len(theirs) + 3
    waiting = other.dyad_async("--json", "consume", other.path("h/late.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 120})
    assert other.wait_waiters(1, procs=[waiting]) is not None, waiting.communicate()

    assert host.stop(sig) == (-signal.SIGKILL if sig == signal.SIGKILL else 0)
    # While the host is down: one file rewritten (same size), one removed,
    # one rewritten with its old mtime put back (its ctime still changes).
    st = os.stat(host.path("h/touched.bin"))
    harness.write_file(host.path("h/changed.bin"), os.path.getsize(host.path("h/changed.bin")), seed=999)
    os.unlink(host.path("h/gone.bin"))
    harness.write_file(host.path("h/touched.bin"), st.st_size, seed=998)
    os.utime(host.path("h/touched.bin"), ns=(st.st_atime_ns, st.st_mtime_ns))
    host.start()
    other.wait_status(lambda s: s["metadata_store"]["rejoined"] >= 1, "registered again")

    after = ls(other)
    stale = {"h/changed.bin", "h/gone.bin", "h/touched.bin"}
    assert set(after) == set(before) - stale, sorted(set(after) ^ (set(before) - stale))
    for name in mine + theirs:
        assert after[name]["owner"] == before[name]["owner"]
        assert after[name]["generation"] > before[name]["generation"], name  # a new epoch
        assert after[name]["size"] == before[name]["size"]
    for name in stale:
        p = other.dyad("stat", other.path(name), check=False)
        assert p.returncode == 2, (name, p.stdout, p.stderr)
    # Consumers of the host's files get them byte-identical.
    other.dyad("consume", *[other.path(n) for n in mine], env_extra={"DYAD_WAIT_TIMEOUT": 60})
    for name in mine:
        assert harness.sha256(other.path(name)) == harness.sha256(host.path(name)), name
    # Produced again, a changed file is served with a newer generation.
    host.dyad("produce", host.path("h/changed.bin"))
    rec = stat(other, other.path("h/changed.bin"))
    assert rec["generation"] > before["h/changed.bin"]["generation"]
    consume(other, other.path("h/changed.bin"))
    assert harness.sha256(other.path("h/changed.bin")) == harness.sha256(host.path("h/changed.bin"))
    # The consumer that waited through the restart gets its file.
    harness.write_file(host.path("h/late.bin"), 5000, seed=7)
    host.dyad("produce", host.path("h/late.bin"))
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert json.loads(out)["action"] == "fetched"
    assert harness.sha256(other.path("h/late.bin")) == harness.sha256(host.path("h/late.bin"))


def test_the_host_keeps_its_records_over_two_restarts_and_an_unpublish(cluster):
    host, other = cluster[0], cluster[1]
    for name in ("a.bin", "b.bin", "c.bin"):
        harness.write_file(host.path(name), 1000, seed=len(name))
    host.dyad("produce", host.path("a.bin"), host.path("b.bin"), host.path("c.bin"))
    host.dyad("rm", host.path("c.bin"))
    gens = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        host.stop(sig)
        host.start()
        rows = ls(other)
        assert set(rows) == {"a.bin", "b.bin"}, rows
        gens.append(rows["a.bin"]["generation"])
        assert consume(other, other.path("b.bin"))["action"] in ("fetched", "present")
    assert gens[1] > gens[0]


def test_unusable_publish_ledger_stops_the_start_and_says_why(tmp_path):
    """Going on would drop the host's records without a word."""
    with harness.Cluster(nodes=1, start=False) as c:
        node = c[0]
        state = tmp_path / "state"
        state.mkdir()
        (state / "published.sqlite").write_bytes(b"not a database\n" * 300)
        node.log_path = str(tmp_path / "dyadd.log")
        try:
            node.start(["--state-dir", str(state)])
        except RuntimeError:
            pass
        assert node.proc.wait(timeout=30) == 6
        log = open(node.log_path).read()
        assert str(state / "published.sqlite") in log and "--state-dir" in log, log
        node.proc = None
