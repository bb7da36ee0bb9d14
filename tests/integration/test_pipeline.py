# SPDX-License-Identifier: Apache-2.0
"""Pipelined consume of many files (dyad consume FILE..., several in flight)
and dyad sync: correctness only (what arrives, what fails and how)."""
import glob
import hashlib
import json
import os
import signal
import struct
import subprocess
import threading

import pytest

import harness


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_small(path, i, generation=1):
    """A small file whose bytes say which file and generation it is."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = f"{os.path.basename(path)} generation {generation}\n".encode()
    with open(path, "wb") as f:
        f.write(body * (1 + (i * 7 + generation) % 40))


def errors_by_file(stderr, cons):
    """{relative path: message} of the `dyad consume FILE: message` lines."""
    out = {}
    prefix = "dyad consume "
    for line in stderr.splitlines():
        if not line.startswith(prefix + cons.dir + "/"):
            continue
        rest = line[len(prefix) + len(cons.dir) + 1:]
        name, _, msg = rest.partition(": ")
        out[name] = msg
    return out


@pytest.fixture
def cluster3():
    """node0 hosts the metadata and produces; node1 produces (and is killed);
    node2 consumes."""
    c = harness.Cluster(nodes=3)
    yield c
    c.cleanup()


def test_pipelined_consume_of_5000_files(cluster3):
    home, other, cons = cluster3[0], cluster3[1], cluster3[2]
    a = [f"a/d{i % 20:02d}/f{i:05d}" for i in range(3999)]      # node0's
    b = [f"b/f{i:04d}" for i in range(900)]                     # node1's, killed meanwhile
    never = [f"never/f{i:03d}" for i in range(100)]              # never produced
    again = a[::100]                                            # produced again during the run
    for i, n in enumerate(a):
        write_small(home.path(n), i)
    for i, n in enumerate(b):
        write_small(other.path(n), i)
    # A large file of node1's, so that its service can be killed while a
    # transfer from it is under way.
    harness.write_file(other.path("b/huge.bin"), 256 << 20, seed=5)
    home.dyad("produce", *[home.path(n) for n in a])
    other.dyad("produce", other.path("b/huge.bin"), *[other.path(n) for n in b])
    old = {n: digest(home.path(n)) for n in again}

    names = a[:2000] + ["b/huge.bin"] + a[2000:] + b + never
    assert len(names) == 5000
    # Its output (a line per file) goes to files: nobody reads a pipe meanwhile.
    out_path, err_path = os.path.join(cluster3.root, "consume.out"), os.path.join(cluster3.root, "consume.err")
    with open(out_path, "w") as out_f, open(err_path, "w") as err_f:
        consumer = subprocess.Popen(
            [harness.DYAD, "--json", "consume", "--window", "16", *[cons.path(n) for n in names]],
            env=cons.env(DYAD_WAIT_TIMEOUT=20, DYAD_TRANSFER_TIMEOUT=20), stdout=out_f, stderr=err_f)
    # node1's service dies as soon as bytes of b/huge.bin land.
    killed = []
    watcher = threading.Thread(target=lambda: killed.append(
        harness.kill_when_transfer_starts(other, consumer, cons.dir, "b/huge.bin", timeout=120)))
    watcher.start()
    # Produced again while the consumer runs: a new generation with other bytes.
    for i, n in enumerate(again):
        write_small(home.path(n), i, generation=2)
    home.dyad("produce", *[home.path(n) for n in again])
    new = {n: digest(home.path(n)) for n in again}
    watcher.join()
    assert killed == [True], "the transfer of b/huge.bin finished before its service could be killed"
    consumer.wait(timeout=300)
    with open(out_path) as f:
        out = f.read()
    with open(err_path) as f:
        err = f.read()
    assert consumer.returncode != 0, "files never produced must fail the command"
    done = {}
    failed_json = set()
    for line in out.splitlines():
        r = json.loads(line)
        if r.get("ok", True):
            done[os.path.relpath(r["file"], cons.dir)] = r
        else:  # --json: a failed file has its line too
            failed_json.add(os.path.relpath(r["file"], cons.dir))
    failed = errors_by_file(err, cons)
    assert failed_json == set(failed), sorted(failed_json ^ set(failed))[:5]
    # Every file is reported once, as done or as failed.
    assert set(done) | set(failed) == set(names), sorted(set(names) - set(done) - set(failed))[:5]
    assert not set(done) & set(failed)

    # node0's files all arrive, whole.
    assert not [n for n in a if n in failed], [(n, failed[n]) for n in a if n in failed][:3]
    for n in a:
        if n not in again:
            assert digest(cons.path(n)) == digest(home.path(n)), n
    # Produced again: one generation or the other, whole, never a mix; a
    # consume afterwards brings the newest.
    for n in again:
        assert digest(cons.path(n)) in (old[n], new[n]), n
    cons.dyad("consume", *[cons.path(n) for n in again], env_extra={"DYAD_WAIT_TIMEOUT": 20})
    for n in again:
        assert digest(cons.path(n)) == new[n], n

    # Never produced: a timeout each, naming the file.
    for n in never:
        assert n in failed and f"'{n}' was not produced within 20 s" in failed[n], failed.get(n)
        assert not os.path.exists(cons.path(n))

    # node1's files: whole where they arrived; the others failed with an error
    # naming the file, the owner and its address.
    assert "b/huge.bin" in failed, "the transfer under way when its service died must fail"
    for n in ["b/huge.bin"] + b:
        if n in done:
            assert digest(cons.path(n)) == digest(other.path(n)), n
        else:
            msg = failed[n]
            assert f"'{n}'" in msg and "node1" in msg and other.uri in msg, msg
            assert not os.path.exists(cons.path(n)), n
    assert glob.glob(os.path.join(cons.dir, "b", ".*.dyad-*")) == [], "temporary files left behind"


def test_consume_many_of_one_owner(cluster):
    """3,000 files from one owner with 8 in flight: each arrives once, whole."""
    prod, cons = cluster[0], cluster[1]
    names = [f"s/f{i:04d}" for i in range(3000)]
    for i, n in enumerate(names):
        write_small(prod.path(n), i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    before = prod.status()["counters"]
    p = cons.dyad("--json", "consume", "--window", "8", *[cons.path(n) for n in names])
    got = [json.loads(line) for line in p.stdout.splitlines()]
    assert sorted(os.path.relpath(r["file"], cons.dir) for r in got) == names
    assert all(r["action"] == "fetched" for r in got)
    for n in names[::50]:
        assert digest(cons.path(n)) == digest(prod.path(n)), n
    after = prod.status()["counters"]
    assert after["served"] - before["served"] == 3000
    # Small files of one owner travel many to a request (dyad.fetch_many).
    many = after["fetch_many_requests"] - before["fetch_many_requests"]
    assert 3000 // 64 <= many <= 3000 // 8, many
    assert after["requests"] - before["requests"] == 0


def test_many_small_files_beside_large_and_locked_ones(cluster):
    """dyad.fetch_many carries the small files; a large one, and one its
    producer holds locked while the consume starts, are fetched alone (the
    owner answers that one with an error, and the lone fetch waits for the
    lock). Everything arrives whole."""
    import fcntl
    import time
    prod, cons = cluster[0], cluster[1]
    small = [f"m/s{i:03d}" for i in range(200)]
    large = [f"m/l{i}" for i in range(3)]
    for i, n in enumerate(small):
        write_small(prod.path(n), i)
    for i, n in enumerate(large):
        harness.write_file(prod.path(n), (1 << 20) + i, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in small + large])
    locked = small[17]
    before = prod.status()["counters"]
    with open(prod.path(locked), "r+b") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)  # a producer rewriting it, as far as dyadd can tell
        consumer = subprocess.Popen(
            [harness.DYAD, "--json", "consume", *[cons.path(n) for n in small + large]],
            env=cons.env(DYAD_WAIT_TIMEOUT=30), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert consumer.poll() is None, "the locked file cannot have been fetched"
        assert not os.path.exists(cons.path(locked))
        fcntl.lockf(f, fcntl.LOCK_UN)
    out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    for n in small + large:
        assert digest(cons.path(n)) == digest(prod.path(n)), n
    after = prod.status()["counters"]
    assert after["fetch_many_requests"] > before["fetch_many_requests"]
    # The large ones and the locked one, alone.
    assert after["requests"] - before["requests"] >= len(large) + 1


def test_fetch_many_requests_out_of_the_ordinary(cluster):
    """Malformed dyad.fetch_many requests get errors, per request or per
    file; the service keeps serving."""
    from rawwire import END, ERROR, RESPONSE, Raw
    prod, cons = cluster[0], cluster[1]
    write_small(prod.path("r/ok"), 1)
    prod.dyad("produce", prod.path("r/ok"))
    for files, whole_error in [(None, True), ([], True), ("x", True), ([{}] * 65, True),
                               ([{"upath": "../../etc/passwd"}, 7, {"upath": "r/ok"}, {"upath": "r/nope"}],
                                False)]:
        r = Raw.to(prod, timeout=10)
        args = {} if files is None else {"files": files}
        tag = r.request("dyad.fetch_many", **args)
        frames = []
        while True:
            f = r.recv()
            if f["tag"] != tag:
                continue
            frames.append((f, f["data"]))
            if f["type"] in (END, ERROR):
                break
        r.close()
        if whole_error:
            assert frames[-1][0]["type"] == ERROR, frames
            continue
        answers = {f["meta"]["i"]: (f["meta"], data) for f, data in frames if f["type"] == RESPONSE}
        assert sorted(answers) == [0, 1, 2, 3]
        assert "rc" in answers[0][0] and "rc" in answers[1][0] and "rc" in answers[3][0]
        assert "no file 'r/nope'" in answers[3][0]["msg"]
        assert answers[2][0]["size"] == os.path.getsize(prod.path("r/ok"))
        with open(prod.path("r/ok"), "rb") as fh:
            assert answers[2][1] == fh.read()
        assert prod.proc.poll() is None
    # The compact answer, for a client that asks: a served file's frame has
    # no meta, its data is the index (u32 LE), the XXH3-64 (u64 LE), then
    # the bytes; refusals keep their JSON meta; the END says the format.
    r = Raw.to(prod, timeout=10)
    tag = r.request("dyad.fetch_many", answer="raw",
                    files=[{"upath": "r/nope"}, {"upath": "r/ok"}, {"upath": "../x"}])
    frames = []
    while True:
        f = r.recv()
        if f["tag"] == tag:
            frames.append(f)
            if f["type"] in (END, ERROR):
                break
    r.close()
    assert frames[-1]["type"] == END and frames[-1]["meta"] == {"files": 3, "format": "raw"}, frames[-1]
    served = [f for f in frames[:-1] if f["meta"] is None]
    refused = {f["meta"]["i"]: f["meta"] for f in frames[:-1] if f["meta"] is not None}
    assert sorted(refused) == [0, 2] and all("rc" in m for m in refused.values()), refused
    assert len(served) == 1
    index, xxh3 = struct.unpack("<IQ", served[0]["data"][:12])
    with open(prod.path("r/ok"), "rb") as fh:
        body = fh.read()
    assert index == 1 and served[0]["data"][12:] == body
    # The digest is the one the JSON answer gives in hex.
    r = Raw.to(prod, timeout=10)
    tag = r.request("dyad.fetch_many", files=[{"upath": "r/ok"}])
    while True:
        f = r.recv()
        if f["tag"] == tag and f["type"] == RESPONSE:
            break
    r.close()
    assert f["meta"]["xxh3"] == f"{xxh3:016x}" and f["data"] == body, (f["meta"], xxh3)

    cons.dyad("consume", cons.path("r/ok"))
    assert digest(cons.path("r/ok")) == digest(prod.path("r/ok"))


def test_sync_follow_consumes_files_as_they_appear(cluster):
    prod, cons = cluster[0], cluster[1]
    first = [f"ds/train/s{i:02d}" for i in range(10)]
    for i, n in enumerate(first):
        write_small(prod.path(n), i)
    for n in ("ds2/x", "other/y", "ds"):  # beside the prefix: never consumed
        write_small(prod.path(n) if n != "ds" else prod.path("dsfile"), 1)
    prod.dyad("produce", *[prod.path(n) for n in first], prod.path("ds2/x"), prod.path("other/y"),
              prod.path("dsfile"))
    sync = cons.dyad_async("--json", "sync", "--follow", "--count", "35", "ds")
    # The files produced before it started arrive...
    harness.wait_for(lambda: all(os.path.exists(cons.path(n)) for n in first) or sync.poll() is not None,
                     timeout=60, what="the first files in the consumer directory")
    assert sync.poll() is None, sync.communicate()
    # ...then those produced while it runs, including a new generation of one.
    later = [f"ds/train/t{i:02d}" for i in range(20)] + [f"ds/val/v{i}" for i in range(4)]
    for i, n in enumerate(later):
        write_small(prod.path(n), i)
        prod.dyad("produce", prod.path(n))
    write_small(prod.path(first[0]), 0, generation=2)
    prod.dyad("produce", prod.path(first[0]))
    out, err = sync.communicate(timeout=120)
    assert sync.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 35, (len(lines), err)
    assert sorted({os.path.relpath(r["file"], cons.dir) for r in lines}) == sorted(first + later)
    for n in first + later:
        assert digest(cons.path(n)) == digest(prod.path(n)), n
    for n in ("ds2/x", "other/y", "dsfile"):
        assert not os.path.exists(cons.path(n)), n


def test_sync_once_and_interrupted_follow(cluster):
    prod, cons = cluster[0], cluster[1]
    names = [f"run1/out/r{i}" for i in range(12)]
    for i, n in enumerate(names):
        write_small(prod.path(n), i)
    prod.dyad("produce", *[prod.path(n) for n in names], prod.path("run1/out/r0"))
    # Without --follow: one pass over what is there, then done.
    p = cons.dyad("sync", "run1")
    assert "12 files consumed" in p.stderr, p.stderr
    for n in names:
        assert digest(cons.path(n)) == digest(prod.path(n)), n
    # Nothing new: a second pass moves nothing.
    p = cons.dyad("--json", "sync", "run1/out/")
    assert [json.loads(line)["action"] for line in p.stdout.splitlines()] == ["present"] * 12
    # --follow ends at SIGINT with 0 and says so.
    s = cons.dyad_async("sync", "--follow", "run1/later")
    write_small(prod.path("run1/later/x"), 1)
    prod.dyad("produce", prod.path("run1/later/x"))
    harness.wait_for(lambda: os.path.exists(cons.path("run1/later/x")) or s.poll() is not None, timeout=60,
                     what="run1/later/x in the consumer directory")
    assert s.poll() is None, s.communicate()
    s.send_signal(signal.SIGINT)
    out, err = s.communicate(timeout=30)
    assert s.returncode == 0, err
    assert "1 file consumed (interrupted)" in err, err


def test_sync_star_prefix(cluster):
    prod, cons = cluster[0], cluster[1]
    for n in ("img/a1", "img/a2", "img/b1"):
        write_small(prod.path(n), 3)
    prod.dyad("produce", prod.path("img/a1"), prod.path("img/a2"), prod.path("img/b1"))
    cons.dyad("sync", "img/a*")
    assert os.path.exists(cons.path("img/a1")) and os.path.exists(cons.path("img/a2"))
    assert not os.path.exists(cons.path("img/b1"))
