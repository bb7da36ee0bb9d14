# SPDX-License-Identifier: Apache-2.0
"""Replicas (issue 35; docs/design.md, "Replicas"): with DYAD_REPLICAS=k the
owner's dyadd has k other services pull each produced file into their state
directory; when the owner is gone (SIGKILL, its link down) or a fetch from it
fails, consumers take the file from a replica of the same generation, and
never from a replica of an older one. Four nodes, each a network namespace
(node0 hosts the embedded store, so the producer on node1 can die)."""
import json
import os
import subprocess
import sys
import time

import pytest

import harness

WAIT = 60
PRODUCER = 1
SYNC = {"DYAD_REPLICAS": 1, "DYAD_REPLICAS_SYNC": 1}
PY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python")


def name(j):
    return f"rep/f{j:03d}.bin"


def size(j):
    return [0, 1, 4096, 65536, 300000, 3 << 20][j % 6] + j


def produce(node, js, env=SYNC, seed=0):
    paths = [node.path(name(j)) for j in js]
    for j, p in zip(js, paths):
        harness.write_file(p, size(j), seed=seed + j)
    return node.dyad("produce", *paths, env_extra=env)


def replica_entries(node, ns="dyad"):
    """The replica entries in the store (namespace NS.replicas), by path: a
    list of (holder, generation) each."""
    out = node.dyad("--json", "ls", env_extra={"DYAD_KVS_NAMESPACE": ns + ".replicas"}).stdout
    try:
        items = json.loads(out) if out.strip().startswith("[") else [json.loads(l) for l in out.splitlines() if l.strip()]
    except json.JSONDecodeError:
        items = []
    got = {}
    for e in items:
        got.setdefault(e["path"], []).append(e["owner"])
    return got


def consume(node, js, *extra, env=None):
    t0 = time.monotonic()
    p = node.dyad("--json", *extra, "consume", *[node.path(name(j)) for j in js], check=False, timeout=4 * WAIT,
                  env_extra={"DYAD_WAIT_TIMEOUT": WAIT, "DYAD_TRANSFER_TIMEOUT": 20, **(env or {})})
    return p, time.monotonic() - t0


def same(cons, owner, js):
    for j in js:
        got, want = cons.path(name(j)), owner.path(name(j))
        assert os.path.getsize(got) == size(j), name(j)
        assert harness.sha256(got) == harness.sha256(want), f"{name(j)} on {cons.name} differs from the produced file"


def test_owner_killed_consumers_get_replicas(make_cluster):
    """k=1, SIGKILL of the owner's dyadd: consumers on the three other nodes
    get every file byte-identical from the replicas; `--explain` says so."""
    c = make_cluster(4, "embedded")
    owner = c[PRODUCER]
    js = range(12)
    p = produce(owner, js)
    assert "replica" not in p.stderr, p.stderr  # k=1 of 3 others: no shortfall
    held = replica_entries(c[0])
    assert all(len(held.get(name(j), [])) == 1 for j in js), held
    assert all(h[0] != owner.name for h in held.values()), held
    owner.kill()
    killed = time.monotonic()
    for i in (0, 2, 3):
        p, took = consume(c[i], js)
        print(f"{c[i].name}: {len(js)} files after the owner's SIGKILL: rc {p.returncode} in {took:.2f}s "
              f"({time.monotonic() - killed:.2f}s since the kill)")
        assert p.returncode == 0, p.stderr
        same(c[i], owner, js)
        for line in p.stdout.splitlines():
            r = json.loads(line)
            assert r["action"] in ("fetched", "in-place"), r
    # --explain names the failover (a file not yet on node 2).
    produce_none = c[2].path(name(0))
    os.unlink(produce_none)
    p = c[2].dyad("consume", "--explain", produce_none, check=False,
                  env_extra={"DYAD_WAIT_TIMEOUT": WAIT, "DYAD_TRANSFER_TIMEOUT": 20})
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stderr
    assert "replica" in p.stdout + p.stderr, p.stdout + p.stderr


def test_link_down_with_leases(make_cluster):
    """etcd with --lease-ttl 3; the owner's namespace loses its link: the
    consumers get the files from the replicas (and, once its lease is gone,
    still do)."""
    c = make_cluster(4, "etcd", dyadd_args=["--lease-ttl", "3"])
    owner = c[PRODUCER]
    js = range(6)
    produce(owner, js)
    subprocess.run(owner.prefix + ["ip", "link", "set", "eth0", "down"], check=True)
    try:
        down = time.monotonic()
        p, took = consume(c[2], js)
        print(f"node2: link down: rc {p.returncode} in {took:.2f}s: {p.stderr.strip()[-500:]}")
        assert p.returncode == 0, p.stderr
        same(c[2], owner, js)
        harness.wait_for(lambda: not any(k.endswith(f"/services/{owner.name}") for k in
                                         c.etcd.ctl("get", "--prefix", "/", "--keys-only").stdout.split()),
                         30, interval=0.1, what="the owner's lease to run out")
        print(f"lease gone {time.monotonic() - down:.2f}s after the link went down")
        p, took = consume(c[3], js)
        print(f"node3 after the lease: rc {p.returncode} in {took:.2f}s")
        assert p.returncode == 0, p.stderr
        same(c[3], owner, js)
    finally:
        subprocess.run(owner.prefix + ["ip", "link", "set", "eth0", "up"], check=False)


def test_reproduced_file_never_served_from_an_old_replica(make_cluster):
    """Produce A (k=1), kill the owner, a consumer gets A from the replica.
    Restart the owner, rewrite the file as B with the same size and mtime,
    produce it with k=1: after another kill consumers get B. Rewrite it as C
    (same size and mtime) and produce it without replicas, kill: nobody gets
    B (the replica is of an older generation); with the owner back, C."""
    c = make_cluster(4, "embedded")
    owner = c[PRODUCER]
    f = owner.path(name(1))
    produce(owner, [1], seed=10)
    st = os.stat(f)
    owner.kill()
    p, _ = consume(c[2], [1])
    assert p.returncode == 0, p.stderr
    same(c[2], owner, [1])

    def rewrite(seed, env):
        harness.write_file(f, size(1), seed=seed)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        owner.start()
        owner.dyad("produce", f, env_extra=env)
        owner.kill()

    rewrite(20, SYNC)
    for i in (2, 3):
        p, _ = consume(c[i], [1])
        assert p.returncode == 0, p.stderr
        same(c[i], owner, [1])
    b = harness.sha256(f)
    rewrite(30, {"DYAD_REPLICAS": 0})
    for i in (2, 3, 0):
        p, _ = consume(c[i], [1])
        assert p.returncode != 0, f"{c[i].name} got a file whose owner is gone and that has no replica of its generation"
        assert harness.sha256(c[i].path(name(1))) == b if os.path.exists(c[i].path(name(1))) and i != 0 else True
        assert "no replica of generation" in p.stderr, p.stderr
    owner.start()
    p, _ = consume(c[3], [1])
    assert p.returncode == 0, p.stderr
    same(c[3], owner, [1])


def test_holder_killed_mid_pull_leaves_no_replica_recorded(make_cluster):
    """(etcd) Asynchronous k=1 of a large file: the service pulling it is killed as
    soon as its bytes start to land. Its partial copy is never recorded; the
    owner gives the replica to the next service, whose copy is whole."""
    c = make_cluster(4, "etcd")  # any node may hold it: none hosts the store
    owner = c[PRODUCER]
    big = owner.path("rep/big.bin")
    harness.write_file(big, 256 << 20, seed=5)
    others = [c[i] for i in (0, 2, 3)]
    import glob
    patterns = {n.name: os.path.join(n.dir, ".dyad", "replicas", "dyad", "rep", ".big.bin.dyad-*") for n in others}
    producer = owner.dyad_async("produce", big, env_extra={"DYAD_REPLICAS": 1})

    def pulling():
        for n in others:
            for t in glob.glob(patterns[n.name]):
                try:
                    if os.path.getsize(t) > 0:
                        return n
                except OSError:
                    pass
        return None

    victim = harness.wait_for(pulling, 60, interval=0.002, what="a replica pull to start")
    victim.kill()
    out, err = producer.communicate(timeout=WAIT)
    assert producer.returncode == 0, err

    asker = next(n for n in others if n is not victim)

    def recorded():
        held = replica_entries(asker).get("rep/big.bin", [])
        return held if held else None

    held = harness.wait_for(recorded, 120, interval=0.2, what="the replica to be recorded on another service")
    assert victim.name not in held, f"{victim.name} was killed mid-pull and is recorded as holding a replica: {held}"
    holder = next(n for n in others if n.name == held[0])
    copy = os.path.join(holder.dir, ".dyad", "replicas", "dyad", "rep", "big.bin")
    assert harness.sha256(copy) == harness.sha256(big)
    owner.kill()
    cons = next(n for n in (c[2], c[3]) if n is not victim)
    p = cons.dyad("consume", cons.path("rep/big.bin"), check=False, timeout=4 * WAIT,
                  env_extra={"DYAD_WAIT_TIMEOUT": WAIT})
    assert p.returncode == 0, p.stderr
    assert harness.sha256(cons.path("rep/big.bin")) == harness.sha256(big)


def test_more_replicas_than_services(make_cluster):
    """k=5 with 3 other services: a clear warning, and 3 replicas."""
    c = make_cluster(4, "embedded")
    owner = c[PRODUCER]
    p = produce(owner, [2], env={"DYAD_REPLICAS": 5, "DYAD_REPLICAS_SYNC": 1})
    print(p.stderr)
    assert "3 of the 5 replicas" in p.stderr, p.stderr
    held = replica_entries(c[0])[name(2)]
    assert sorted(held) == ["node0", "node2", "node3"], held


def test_wrapper_and_python_fail_over(make_cluster):
    """The LD_PRELOAD wrapper (an unmodified `cat`) and pydyad (the C API
    through ctypes) get files of a killed owner from the replicas too."""
    c = make_cluster(4, "embedded")
    owner = c[PRODUCER]
    js = range(4)
    produce(owner, js)
    owner.kill()
    cons = c[2]
    wrapper = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
    env = cons.env(**{**harness.preload_env(wrapper), "DYAD_WAIT_TIMEOUT": WAIT})
    for j in (0, 1):
        out = subprocess.run(cons.prefix + ["cat", cons.path(name(j))], env=env, capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr
        with open(owner.path(name(j)), "rb") as f:
            assert out.stdout == f.read(), f"{name(j)} read through the wrapper differs"
    env = cons.env(DYAD_WAIT_TIMEOUT=WAIT)
    env["PYTHONPATH"] = PY_DIR
    env["DYAD_LIBRARY"] = os.path.join(harness.BUILD, "lib", "libdyad.so")
    code = ("import sys\nfrom pydyad import Dyad\nd = Dyad(); d.init_env()\n"
            "for p in sys.argv[1:]:\n    d.consume(p)\n")
    out = subprocess.run(cons.prefix + [sys.executable, "-c", code] + [cons.path(name(j)) for j in (2, 3)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    same(cons, owner, (2, 3))


def stat_json(node, rel):
    p = node.dyad("--json", "stat", node.path(rel), check=False)
    return p, (json.loads(p.stdout) if p.returncode == 0 else None)


def test_stat_lists_the_copies(make_cluster):
    """k=1: `dyad stat` (human and --json) names the owner and the replica
    holder of the record's generation, as failover would use it."""
    c = make_cluster(4, "embedded")
    owner = c[PRODUCER]
    produce(owner, [3])
    held = replica_entries(c[0])[name(3)]
    assert len(held) == 1 and held[0] != owner.name, held
    p, j = stat_json(c[2], name(3))
    assert p.returncode == 0, p.stderr
    print(p.stdout)
    assert j["owner"] == owner.name, j
    assert [r["holder"] for r in j["replicas"]] == held, j
    assert j["replicas"][0]["generation"] == j["generation"], j
    human = c[3].dyad("stat", c[3].path(name(3))).stdout
    print(human)
    assert f"owner: {owner.name}" in human, human
    assert f"replica: {held[0]} on node " in human, human


def test_rm_removes_the_replicas(make_cluster):
    """k=1: `dyad rm` on the owner; its dyadd then asks the holder to drop
    its copy (dyad.unreplicate, after the rm answers): the replica file
    leaves the holder's state directory, its entry leaves the store, the
    counters say so, and stat finds no copy left."""
    c = make_cluster(4, "embedded")
    owner = c[PRODUCER]
    produce(owner, [3, 4])
    held = replica_entries(c[0])
    holder = next(n for n in c if n.name == held[name(3)][0])
    copy = os.path.join(holder.dir, ".dyad", "replicas", "dyad", name(3))
    assert os.path.exists(copy), copy
    p = owner.dyad("rm", owner.path(name(3)))
    print(p.stdout, p.stderr)

    def dropped():
        return not os.path.exists(copy) and name(3) not in replica_entries(c[0])

    harness.wait_for(dropped, 20, interval=0.1, what="the holder to drop the replica of the removed file")
    # The other file keeps its replica.
    assert replica_entries(c[0]).get(name(4)) == held[name(4)]
    p, j = stat_json(c[2], name(3))
    assert p.returncode != 0 and "not" in p.stderr, (p.stdout, p.stderr)
    st = json.loads(owner.dyad("--json", "service", "status").stdout)
    print(st.get("replicas"))
    assert st["replicas"]["unreplicated"] == 1, st["replicas"]
    st = json.loads(holder.dyad("--json", "service", "status").stdout)
    keeps = held[name(4)].count(holder.name)  # f004's replica may be on the same holder
    assert st["replicas"]["dropped"] == 1 and st["replicas"]["held"] == keeps, st["replicas"]
    # Produced again: the new generation is replicated and listed by stat.
    produce(owner, [3], seed=7)
    p, j = stat_json(c[2], name(3))
    assert p.returncode == 0, p.stderr
    assert [r["generation"] for r in j["replicas"]] == [j["generation"]], j


def test_holders_pull_small_files_in_batches(make_cluster):
    """k=1, many small files published in one `dyad produce` (replicas made
    in the background): the owner's queue hands them to each holder in
    batches (dyad.replicate_many) and a holder pulls a batch with one
    batched consume, so the owner answers far fewer fetch requests than
    there are files (one whole consume per file before). Every replica is
    recorded, and with the owner killed each file is read whole from its
    replica."""
    c = make_cluster(4, "embedded")
    owner = c[PRODUCER]
    js = list(range(100, 220))
    paths = [owner.path(f"batch/f{j:03d}.bin") for j in js]
    for j, p in zip(js, paths):
        harness.write_file(p, 4096 + j, seed=j)
    owner.dyad("produce", *paths, env_extra={"DYAD_REPLICAS": 1})
    want = {f"batch/f{j:03d}.bin" for j in js}

    def all_held():
        return want <= set(replica_entries(c[0]))

    harness.wait_for(all_held, 60, interval=0.2, what="a replica entry for every file")
    st = json.loads(owner.dyad("--json", "service", "status").stdout)
    n = st["counters"]
    fetches = n["requests"] + n["fetch_many_requests"]
    print(f"the owner answered {n['requests']} dyad.fetch and {n['fetch_many_requests']} dyad.fetch_many")
    holders = [json.loads(x.dyad("--json", "service", "status").stdout)["replicas"] for x in c if x is not owner]
    print("holders:", [(h["batches"], h["pulled"]) for h in holders])
    assert fetches <= len(js) // 4, n
    assert sum(h["batches"] for h in holders) >= 1, holders
    assert sum(h["pulled"] for h in holders) == len(js), holders
    owner.kill()
    reader = next(n for n in c if n is not owner and n.index != 0)
    p = reader.dyad("--json", "consume", *[reader.path(f"batch/f{j:03d}.bin") for j in js], check=False,
                    timeout=4 * WAIT, env_extra={"DYAD_WAIT_TIMEOUT": WAIT, "DYAD_TRANSFER_TIMEOUT": 20})
    assert p.returncode == 0, p.stderr
    for j, src in zip(js, paths):
        with open(src, "rb") as a, open(reader.path(f"batch/f{j:03d}.bin"), "rb") as b:
            assert a.read() == b.read(), src
