# SPDX-License-Identifier: Apache-2.0
"""Several nodes, each a network namespace with its own dyadd, joined by veth
pairs on a bridge; producers and consumers run in different namespaces, so
every byte and every metadata request crosses a veth. Both metadata stores:
"embedded" (node0's dyadd hosts it, the others use --kvs tcp://NODE0) and
"etcd" (an etcd in a namespace of its own, every dyadd --kvs etcd://...)."""
import collections
import json
import os
import signal
import subprocess
import time

import pytest

import harness

STORES = ["embedded", "etcd"]
WAIT = 180  # seconds a consumer waits for a produce: far beyond what any step here takes


def ring_name(owner, j):
    return f"ring/from{owner}/f{j:04d}.bin"


def ring_size(owner, j):
    """0 B .. 64 KiB, and one file in a hundred over 1 MiB."""
    if j % 100 == 7:
        return (1 << 20) + 4099 * owner + j
    return (j * 7919 + owner * 104729) % 65537


def produce(cluster, owners, js, batch=100):
    """Each node in `owners` writes and publishes files js of its ring, in
    batches of `batch`, the nodes side by side."""
    js = list(js)
    for k in range(0, len(js), batch):
        part = js[k:k + batch]
        procs = []
        for i in owners:
            node = cluster[i]
            paths = [node.path(ring_name(i, j)) for j in part]
            for j, p in zip(part, paths):
                harness.write_file(p, ring_size(i, j), seed=1000 * i + j)
            procs.append((node, node.dyad_async("produce", *paths)))
        for node, p in procs:
            out, err = p.communicate(timeout=WAIT)
            assert p.returncode == 0, f"dyad produce on {node.name} failed ({p.returncode}): {err}"


def consume_async(node, owner, js):
    """`node` consumes files js of `owner`'s ring (waiting for them)."""
    paths = [node.path(ring_name(owner, j)) for j in js]
    return node.dyad_async("--json", "consume", *paths, env_extra={"DYAD_WAIT_TIMEOUT": WAIT})


def wait_consumers_waiting(consumers):
    """Waits until every consumer in `consumers` ((node, proc) pairs) waits
    for a produce in its metadata store (the consumers of one store host
    add up)."""
    procs = [p for _, p in consumers]
    per_host = collections.Counter(n.store_host().name for n, _ in consumers)
    by_name = {n.store_host().name: n for n, _ in consumers}
    for name, count in per_host.items():
        by_name[name].wait_waiters(count, procs=procs)


def check_consumed(cons, owner_node, proc, js, action="fetched"):
    out, err = proc.communicate(timeout=WAIT + 60)
    assert proc.returncode == 0, f"{cons.name} consuming {owner_node.name}'s files failed ({proc.returncode}): {err}"
    reports = [json.loads(line) for line in out.splitlines()]
    assert len(reports) == len(js), out[-2000:]
    for r in reports:
        assert r["action"] == action, r
        if action == "fetched":
            assert r["endpoint"] == owner_node.uri, r
    for j in js:
        rel = ring_name(owner_node.index, j)
        got, want = cons.path(rel), owner_node.path(rel)
        assert os.path.getsize(got) == ring_size(owner_node.index, j), rel
        assert harness.sha256(got) == harness.sha256(want), f"{rel} on {cons.name} differs from {owner_node.name}'s"


def listed(node):
    """The records `dyad --json ls` run on `node` lists (a JSON array, or one
    object per line)."""
    out = node.dyad("--json", "ls").stdout
    try:
        records = json.loads(out)
    except json.JSONDecodeError:
        records = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {r["path"]: r for r in records}


def test_etcd_of_the_harness(make_cluster):
    """What the etcd tests rely on, with any dyadd: the harness's etcd serves
    every node's namespace on the test subnet, keeps what it acknowledged
    across a SIGKILL and restart, and runs in a namespace of its own."""
    c = make_cluster(2, "etcd", etcd_only=True)
    for n in c.nodes:
        p = subprocess.run(n.prefix + [harness.ETCDCTL, "--endpoints", c.etcd.client_url, "put",
                                       f"/dyad-test/{n.name}", n.host], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    c.etcd.restart(signal.SIGKILL)
    got = c.etcd.ctl("get", "--prefix", "/dyad-test/").stdout.split()
    assert got == ["/dyad-test/node0", c[0].host, "/dyad-test/node1", c[1].host]
    assert c.etcd.host not in {n.host for n in c.nodes}
    # Not on a node's own loopback: only across the veths.
    p = subprocess.run(c[0].prefix + [harness.ETCDCTL, "--endpoints", f"http://127.0.0.1:{c.etcd.port}",
                                      "--dial-timeout", "1s", "get", "/dyad-test/node0"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "deadline exceeded" in p.stderr, p.stderr


@pytest.mark.parametrize("store", STORES)
def test_ring_of_four_nodes(make_cluster, store):
    """Node i produces 500 files that node i+1 consumes; the consumers start
    first and wait. Every file arrives byte-identical from its owner, and
    every node lists all 2,000 records."""
    nodes, files = 4, 500
    c = make_cluster(nodes, store)
    js = range(files)
    consumers = [(c[(i + 1) % nodes], consume_async(c[(i + 1) % nodes], i, js)) for i in range(nodes)]
    wait_consumers_waiting(consumers)
    produce(c, range(nodes), js)
    for i, (cons, proc) in enumerate(consumers):
        check_consumed(cons, c[i], proc, js)
    for node in c.nodes:
        records = listed(node)
        want = {ring_name(i, j) for i in range(nodes) for j in js}
        assert want <= set(records), f"{node.name} lists {len(want - set(records))} records too few"
        for i in range(nodes):
            assert records[ring_name(i, 0)]["owner"] == c[i].name


def test_etcd_restarted_mid_run(make_cluster):
    """etcd is killed (SIGKILL) and started again while consumers on every
    node wait for files not produced yet: no record is lost, the waiting
    consumers resume and finish, and files published before the restart are
    still served to a new consumer."""
    nodes, half = 4, 50
    c = make_cluster(nodes, "etcd")
    first, second = range(half), range(half, 2 * half)
    consumers = [(c[(i + 1) % nodes], consume_async(c[(i + 1) % nodes], i, range(2 * half))) for i in range(nodes)]
    wait_consumers_waiting(consumers)
    produce(c, range(nodes), first, batch=half)

    def first_half_arrived():
        for i, (cons, p) in enumerate(consumers):
            if p.poll() is not None:
                return True  # ended early: check_consumed reports it
            if not all(os.path.exists(cons.path(ring_name(i, j))) for j in first):
                return False
        return True

    harness.wait_for(first_half_arrived, WAIT, what="the consumers to receive the first half")
    c.etcd.restart(signal.SIGKILL)
    records = listed(c[2])
    lost = {ring_name(i, j) for i in range(nodes) for j in first} - set(records)
    assert not lost, f"{len(lost)} records lost in the restart of etcd, e.g. {sorted(lost)[:3]}"
    produce(c, range(nodes), second, batch=half)
    for i, (cons, proc) in enumerate(consumers):
        check_consumed(cons, c[i], proc, range(2 * half))
    # A consumer that starts after the restart gets files published before it.
    late = harness.NodeView(c[2], os.path.join(c.root, "late2"))
    p = consume_async(late, 0, first)
    check_consumed(late, c[0], p, first)


def consume_victims(cons, victim, files):
    """`cons` consumes the killed owner's files: (process result, seconds)."""
    t0 = time.monotonic()
    p = cons.dyad("consume", *[cons.path(ring_name(victim.index, j)) for j in range(files)], check=False,
                  timeout=2 * WAIT, env_extra={"DYAD_WAIT_TIMEOUT": WAIT, "DYAD_TRANSFER_TIMEOUT": WAIT})
    return p, time.monotonic() - t0


def registered(etcd, service):
    """Whether etcd holds a registration of `service` (a key .../services/<id>)."""
    keys = etcd.ctl("get", "--prefix", "/", "--keys-only").stdout.split()
    return any(k.endswith(f"/services/{service}") for k in keys)


@pytest.mark.parametrize("store", STORES)
def test_owner_killed(make_cluster, store):
    """Node 2's dyadd is killed with SIGKILL after publishing. A consumer of
    its files fails with an error naming the owner (not a timeout: it would
    wait up to WAIT seconds for one), at once and, with etcd, once the
    owner's lease (--lease-ttl 3) has expired: then "gone". The other nodes
    keep producing and consuming."""
    nodes, files = 4, 20
    args = ["--lease-ttl", "3"] if store == "etcd" or "--lease-ttl" in harness.dyadd_help() else []
    c = make_cluster(nodes, store, dyadd_args=args)
    victim, cons = c[2], c[3]
    produce(c, range(nodes), range(files))
    if store == "etcd":
        assert registered(c.etcd, victim.name)
    killed = time.monotonic()
    victim.kill()
    p, took = consume_victims(cons, victim, files)
    print(f"{store}: consumer right after the kill: rc {p.returncode} after {took:.2f}s: {p.stderr.strip()}")
    assert p.returncode not in (0, 3), p.stderr
    assert victim.name in p.stderr, f"the error does not name the owner {victim.name}: {p.stderr}"
    assert "timed out" not in p.stderr and "timeout" not in p.stderr, p.stderr
    if store == "etcd":
        harness.wait_for(lambda: not registered(c.etcd, victim.name), 60, interval=0.1,
                         what=f"{victim.name}'s registration to go with its lease")
        print(f"etcd: {victim.name}'s registration went {time.monotonic() - killed:.2f}s after the kill")
        p, took = consume_victims(cons, victim, files)
        print(f"etcd: consumer after the lease: rc {p.returncode} after {took:.2f}s: {p.stderr.strip()}")
        assert p.returncode not in (0, 3), p.stderr
        assert victim.name in p.stderr and "gone" in p.stderr, f"not an 'owner service gone' error: {p.stderr}"
    assert not os.path.exists(cons.path(ring_name(victim.index, 0))), "a file of the killed owner appeared"
    # The others keep going: 0 -> 1, 1 -> 3, 3 -> 0, with files published
    # before the kill and after it.
    pairs = [(0, 1), (1, 3), (3, 0)]
    produce(c, [0, 1, 3], range(files, 2 * files))
    procs = [(c[o], c[n], consume_async(c[n], o, range(2 * files))) for o, n in pairs]
    for owner, consumer, proc in procs:
        check_consumed(consumer, owner, proc, range(2 * files))
