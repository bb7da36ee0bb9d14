# SPDX-License-Identifier: Apache-2.0
"""Files move from a producer to a waiting consumer across two services."""
import json
import os
import subprocess
import sys
import textwrap
import time

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

digest = harness.sha256




def test_consumer_first_100_files_nested(cluster):
    prod, cons = cluster[0], cluster[1]
    sizes = [0, 1, 2, 4095, 4096, 4097] + [(i * 167_773) % (16 << 20) for i in range(1, 93)] + [16 << 20, (16 << 20) - 1]
    assert len(sizes) == 100
    names = [f"d{i % 4}/sub{i % 3}/f{i:03d}.dat" if i % 2 else f"f{i:03d}.dat" for i in range(100)]
    consumer = cons.dyad_async("--json", "consume", *[cons.path(n) for n in names],
                               env_extra={"DYAD_WAIT_TIMEOUT": 120})
    cons.wait_waiters(1, procs=[consumer])
    assert consumer.poll() is None, "consumer must be waiting before anything is produced"
    for i, (n, s) in enumerate(zip(names, sizes)):
        harness.write_file(prod.path(n), s, seed=i)
    # Produce in batches, as a simulation would while the consumer waits.
    for k in range(0, 100, 25):
        prod.dyad("produce", *[prod.path(n) for n in names[k:k + 25]])
    out, err = consumer.communicate(timeout=300)
    assert consumer.returncode == 0, err
    reports = [json.loads(l) for l in out.splitlines()]
    assert [r["action"] for r in reports] == ["fetched"] * 100
    for n, s in zip(names, sizes):
        assert os.path.getsize(cons.path(n)) == s
        assert digest(cons.path(n)) == digest(prod.path(n)), n
    # Nothing but the files (and DYAD's hidden state) in the consumer directory.
    leftovers = [f for _, _, fs in os.walk(cons.dir) for f in fs if ".dyad-" in f]
    assert leftovers == []


def test_two_consumers_same_file_move_it_once(cluster):
    prod, cons = cluster[0], cluster[1]
    harness.write_file(prod.path("shared/big.bin"), 64 << 20, seed=7)
    a = cons.dyad_async("--json", "consume", cons.path("shared/big.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 60})
    b = cons.dyad_async("--json", "consume", cons.path("shared/big.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 60})
    cons.wait_waiters(2, procs=[a, b])  # both wait before the produce: they race for one transfer
    prod.dyad("produce", prod.path("shared/big.bin"))
    outs = []
    for p in (a, b):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert sorted(o["action"] for o in outs) == ["fetched", "present"]
    assert digest(cons.path("shared/big.bin")) == digest(prod.path("shared/big.bin"))
    st = prod.status()["counters"]
    assert st["served"] == 1
    assert st["bytes_sent"] == 64 << 20


def test_same_node_same_directory_moves_nothing(cluster):
    prod = cluster[0]
    harness.write_file(prod.path("local.bin"), 1 << 20, seed=3)
    prod.dyad("produce", prod.path("local.bin"))
    r = json.loads(prod.dyad("--json", "consume", prod.path("local.bin")).stdout)
    assert r["action"] == "in-place"
    assert prod.status()["counters"]["requests"] == 0


def test_reproduce_bumps_generation_and_refetches(cluster):
    prod, cons = cluster[0], cluster[1]
    p = prod.path("gen.txt")
    with open(p, "w") as f:
        f.write("first")
    prod.dyad("produce", p)
    cons.dyad("consume", cons.path("gen.txt"))
    assert open(cons.path("gen.txt")).read() == "first"
    assert json.loads(cons.dyad("--json", "stat", cons.path("gen.txt")).stdout)["generation"] == 1
    with open(p + ".new", "w") as f:
        f.write("second, longer")
    os.rename(p + ".new", p)
    prod.dyad("produce", p)
    assert json.loads(cons.dyad("--json", "stat", cons.path("gen.txt")).stdout)["generation"] == 2
    r = json.loads(cons.dyad("--json", "consume", cons.path("gen.txt")).stdout)
    assert r["action"] == "fetched"
    assert open(cons.path("gen.txt")).read() == "second, longer"
    # Same generation again: nothing moves.
    assert json.loads(cons.dyad("--json", "consume", cons.path("gen.txt")).stdout)["action"] == "present"


def test_ls_lists_produced_files(cluster):
    prod, cons = cluster[0], cluster[1]
    for n in ("a.txt", "x/b.txt"):
        harness.write_file(prod.path(n), 10)
        prod.dyad("produce", prod.path(n))
    rows = [json.loads(line) for line in cons.dyad("--json", "ls").stdout.splitlines()]
    assert sorted(r["path"] for r in rows) == ["a.txt", "x/b.txt"]
    assert all(r["owner"] == "node0" for r in rows)


def test_shared_storage_only_synchronises(cluster):
    prod, cons = cluster[0], cluster[1]
    harness.write_file(prod.path("s.bin"), 1000)
    prod.dyad("produce", prod.path("s.bin"))
    r = json.loads(cons.dyad("--json", "consume", cons.path("s.bin"),
                             env_extra={"DYAD_SHARED_STORAGE": "1"}).stdout)
    assert r["action"] == "in-place"
    assert not os.path.exists(cons.path("s.bin"))
    # "0" means off (DYAD treated any value as on).
    r = json.loads(cons.dyad("--json", "consume", cons.path("s.bin"),
                             env_extra={"DYAD_SHARED_STORAGE": "0"}).stdout)
    assert r["action"] == "fetched"


def test_stalled_consumer_does_not_delay_others(cluster):
    """A consumer that asks for a big file and never reads must not hold up
    the service: other consumers keep being served."""
    from rawwire import Raw
    prod, cons = cluster[0], cluster[1]
    harness.write_file(prod.path("big.bin"), 256 << 20, seed=5)
    stalled = Raw.to(prod)
    stalled.request("dyad.fetch", upath="big.bin", transport="FLUX_RPC")
    stalled.s.recv(1)  # the transfer has started; now stop reading
    names = [f"small{i}.bin" for i in range(20)]
    for n in names:
        harness.write_file(prod.path(n), 256 << 10)
    prod.dyad("produce", *[prod.path(n) for n in names])
    t0 = time.monotonic()
    p = cons.dyad("consume", *[cons.path(n) for n in names], timeout=60,
                  env_extra={"DYAD_WAIT_TIMEOUT": 10, "DYAD_TRANSFER_TIMEOUT": 10})
    assert p.returncode == 0
    assert time.monotonic() - t0 < 10
    st = prod.status()
    assert st["counters"]["served"] == 20
    stalled.close()


def test_four_concurrent_consumers_on_four_files(cluster):
    prod, cons = cluster[0], cluster[1]
    procs = [cons.dyad_async("consume", cons.path(f"c{i}.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 60}) for i in range(4)]
    for i in range(4):
        harness.write_file(prod.path(f"c{i}.bin"), (32 << 20) + i, seed=i)
    prod.dyad("produce", *[prod.path(f"c{i}.bin") for i in range(4)])
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert digest(cons.path(f"c{i}.bin")) == digest(prod.path(f"c{i}.bin"))


def test_reproduce_with_same_size_and_mtime_is_refetched(cluster):
    """A re-produce the size+mtime quick check cannot see (same size, mtime
    kept as cp -p or tar do) still reaches the consumer: the installed copy
    carries the owner and generation it came from."""
    prod, cons = cluster[0], cluster[1]
    p = prod.path("same.txt")
    with open(p, "w") as f:
        f.write("aaaa")
    st = os.stat(p)
    prod.dyad("produce", p)
    cons.dyad("consume", cons.path("same.txt"))
    assert open(cons.path("same.txt")).read() == "aaaa"
    with open(p, "w") as f:
        f.write("bbbb")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    prod.dyad("produce", p)
    r = json.loads(cons.dyad("--json", "consume", cons.path("same.txt")).stdout)
    assert r["action"] == "fetched"
    assert open(cons.path("same.txt")).read() == "bbbb"
    assert json.loads(cons.dyad("--json", "consume", cons.path("same.txt")).stdout)["action"] == "present"


def test_file_changed_after_produce_is_served_only_once_produced_again(cluster):
    """Only the file as published is served: changed afterwards, it is
    refused (ESTALE, nothing installed) until it is produced again. The
    consumer waits for that produce as for a first one, until
    DYAD_WAIT_TIMEOUT."""
    prod, cons = cluster[0], cluster[1]
    p = prod.path("grown.txt")
    with open(p, "w") as f:
        f.write("1234")
    prod.dyad("produce", p)
    with open(p, "a") as f:
        f.write("5678")  # changed after produce, not re-produced
    t0 = time.monotonic()
    r = cons.dyad("consume", cons.path("grown.txt"), check=False, env_extra={"DYAD_WAIT_TIMEOUT": "1"})
    assert r.returncode == 5, r.stderr
    assert "changed since it was published" in r.stderr and "produced again" in r.stderr, r.stderr
    assert "not produced again within 1 s (DYAD_WAIT_TIMEOUT)" in r.stderr, r.stderr
    assert time.monotonic() - t0 >= 1.0
    assert not os.path.exists(cons.path("grown.txt"))
    # A consumer that comes while the producer writes it again waits for
    # the new produce, and gets the new bytes.
    waiting = cons.dyad_async("--json", "consume", cons.path("grown.txt"), env_extra={"DYAD_WAIT_TIMEOUT": "60"})
    time.sleep(0.5)
    assert waiting.poll() is None, waiting.communicate()
    with open(p, "a") as f:
        f.write("90")
    prod.dyad("produce", p)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert json.loads(out)["action"] == "fetched"
    with open(cons.path("grown.txt")) as f:
        assert f.read() == "1234567890"
    os.unlink(cons.path("grown.txt"))
    with open(p, "w") as f:
        f.write("12345678")
    prod.dyad("produce", p)
    assert json.loads(cons.dyad("--json", "consume", cons.path("grown.txt")).stdout)["action"] == "fetched"
    with open(cons.path("grown.txt")) as f:
        assert f.read() == "12345678"
    assert json.loads(cons.dyad("--json", "consume", cons.path("grown.txt")).stdout)["action"] == "present"


def test_stream_by_sendfile_when_enabled():
    """DYAD_STREAM_SENDFILE=1 on the service: chunks after the checksum pass
    go by sendfile(2); files of every shape arrive intact, by the stream."""
    c = harness.Cluster(nodes=2, env={"DYAD_STREAM_SENDFILE": "1"})
    try:
        prod, cons = c[0], c[1]
        sizes = {"z": 0, "one": 1, "chunk": 1 << 20, "chunk1": (1 << 20) + 1, "nine": (9 << 20) + 3}
        for n, s in sizes.items():
            harness.write_file(prod.path(n), s, seed=s + 7)
        prod.dyad("produce", *[prod.path(n) for n in sizes])
        cons.dyad("consume", *[cons.path(n) for n in sizes],
                  env_extra={"DYAD_DTL_MODE": "FLUX_RPC", "DYAD_WAIT_TIMEOUT": 30})
        for n in sizes:
            assert harness.sha256(prod.path(n)) == harness.sha256(cons.path(n)), n
        stream = prod.status()["counters"]["per_transport"]["FLUX_RPC"]
        assert stream["served"] == len(sizes)
        assert {k: stream["transport"][k] for k in ("sendfile", "sendfile_transfers")} == \
            {"sendfile": True, "sendfile_transfers": 2}
    finally:
        c.cleanup()


def test_no_room_for_a_large_stream_file_is_a_clear_error(cluster):
    """Files above 4 MiB are written behind where asked (a writer thread
    hashes and writes while the next chunks arrive): a write that fails there (an 8 MiB
    tmpfs, a 16 MiB file) still fails the consume naming the file and the
    cause, leaves nothing behind, and the next file (that fits) arrives."""
    prod, cons = cluster[0], cluster[1]
    with harness.small_tmpfs(cons.path("tiny")):
        env = {"DYAD_DTL_MODE": "FLUX_RPC", "DYAD_WAIT_TIMEOUT": 30, "DYAD_WRITE_BEHIND": "on"}
        harness.write_file(prod.path("tiny/big.bin"), 16 << 20, seed=1)
        harness.write_file(prod.path("tiny/fits.bin"), 6 << 20, seed=2)
        prod.dyad("produce", prod.path("tiny/big.bin"), prod.path("tiny/fits.bin"))
        p = cons.dyad("consume", cons.path("tiny/big.bin"), check=False, timeout=120, env_extra=env)
        assert p.returncode != 0
        assert "big.bin" in p.stderr and "No space left on device" in p.stderr, p.stderr
        # Issue 34, item 9: what it needs and what is free.
        assert "it needs more than" in p.stderr and "bytes free on its file system" in p.stderr, p.stderr
        assert os.listdir(cons.path("tiny")) == [], os.listdir(cons.path("tiny"))
        p = cons.dyad("consume", cons.path("tiny/fits.bin"), check=False, timeout=120,
                      env_extra={**env, "DYAD_WRITE_BEHIND": "sometimes"})
        assert p.returncode != 0 and "DYAD_WRITE_BEHIND='sometimes': use auto, on or off" in p.stderr, p.stderr
        assert os.listdir(cons.path("tiny")) == [], os.listdir(cons.path("tiny"))
        cons.dyad("consume", cons.path("tiny/fits.bin"), env_extra=env, timeout=120)
        assert harness.sha256(cons.path("tiny/fits.bin")) == harness.sha256(prod.path("tiny/fits.bin"))


def test_consume_w_metadata_fetches_again_a_file_produced_again_since_its_lookup(cluster):
    """dyad_consume_w_metadata retries as dyad_consume does: a file produced
    again between the lookup and the fetch (the owner refuses the old
    generation, ESTALE) is looked up again and fetched at its new generation."""
    prod, cons = cluster[0], cluster[1]
    p = prod.path("again/w.txt")
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write("first")
    prod.dyad("produce", p)
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        m = d.get_metadata({cons.path('again/w.txt')!r}, should_wait=True)
        print("looked up", m.generation, flush=True)
        sys.stdin.readline()
        d.consume_w_metadata({cons.path('again/w.txt')!r}, m)
        print("consumed", flush=True)
    """)
    env = cons.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"),
                   DYAD_WAIT_TIMEOUT=30)
    consumer = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = consumer.stdout.readline()
        assert line.startswith("looked up 1"), (line, consumer.stderr.read() if not line else "")
        with open(p, "w") as f:
            f.write("second, longer")
        prod.dyad("produce", p)
        out, err = consumer.communicate("go\n", timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    assert consumer.returncode == 0, err
    assert "consumed" in out
    with open(cons.path("again/w.txt")) as f:
        assert f.read() == "second, longer"
