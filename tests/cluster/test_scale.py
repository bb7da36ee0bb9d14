# SPDX-License-Identifier: Apache-2.0
"""Many nodes (issue 33): 16 namespace nodes in `make test`, 64 and 64 with
chaos in `make test-long` (pytest marker `long`). Every node produces files
that two other nodes consume: its ring successor and a random partner (a
permutation, so every node also consumes from exactly two owners). The
metadata is in a 3-member etcd cluster (each member a namespace of its own,
every dyadd --kvs etcd://A,B,C) or, at 16 nodes, in node0's embedded store.
Consumers start first and wait; files arrive byte-identical, nothing
temporary stays behind, every record is listed."""
import collections
import glob
import json
import os
import random
import re
import subprocess
import threading
import time

import pytest

import harness

WAIT = 120  # seconds a consumer waits for a produce (DYAD_WAIT_TIMEOUT)


def fname(owner, j):
    return f"scale/from{owner}/f{j:03d}.bin"


def fsize(owner, j):
    """0 B .. 64 KiB, and file 7 of every owner over 1 MiB."""
    if j == 7:
        return (1 << 20) + 4099 * owner
    return (j * 7919 + owner * 104729) % 65537


def plan(n, seed=33):
    """(owner, consumer) pairs: the ring i -> i+1 and a random permutation
    with no node its own or its successor's partner."""
    rng = random.Random(seed)
    while True:
        perm = list(range(n))
        rng.shuffle(perm)
        if all(perm[i] not in (i, (i + 1) % n) for i in range(n)):
            break
    return [(i, (i + 1) % n) for i in range(n)] + [(i, perm[i]) for i in range(n)]


def write_files(node, js):
    paths = []
    for j in js:
        p = node.path(fname(node.index, j))
        harness.write_file(p, fsize(node.index, j), seed=1000 * node.index + j)
        paths.append(p)
    return paths


def produce(nodes, js, timeout=WAIT):
    """Each node writes and publishes files js, side by side (one dyad produce each)."""
    procs = [(n, n.dyad_async("produce", *write_files(n, js))) for n in nodes]
    failed = []
    for n, p in procs:
        _, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            failed.append(f"{n.name}: rc {p.returncode}: {err.strip()[-300:]}")
    return failed


class Consumer:
    """One `dyad --json consume` of `owner`'s files js into `view`'s directory."""

    def __init__(self, view, owner, js, wait=WAIT, transfer=60):
        self.view, self.owner, self.js = view, owner, list(js)
        self.deadline = wait + transfer  # the longest a consume of ours may take
        paths = [view.path(fname(owner.index, j)) for j in self.js]
        self.started = time.monotonic()
        self.proc = view.dyad_async("--json", "consume", *paths,
                                    env_extra={"DYAD_WAIT_TIMEOUT": wait, "DYAD_TRANSFER_TIMEOUT": transfer})
        self.out = self.err = None
        self.ended = None  # time.monotonic() when seen ended (poll_ended)

    def poll_ended(self):
        if self.ended is None and self.proc.poll() is not None:
            self.ended = time.monotonic()
        return self.ended is not None

    def finish(self, timeout):
        self.out, self.err = self.proc.communicate(timeout=timeout)
        self.poll_ended()
        return self.proc.returncode

    @property
    def took(self):
        return (self.ended or time.monotonic()) - self.started

    def arrived(self, js):
        return all(os.path.exists(self.view.path(fname(self.owner.index, j))) for j in js)

    def check_files(self):
        """(files present and byte-identical, problems): a present file
        must equal the owner's; absent ones are for the error to explain."""
        good, bad = 0, []
        for j in self.js:
            rel = fname(self.owner.index, j)
            got = self.view.path(rel)
            if not os.path.exists(got):
                continue
            if os.path.getsize(got) != fsize(self.owner.index, j) or \
                    harness.sha256(got) != harness.sha256(self.owner.path(rel)):
                bad.append(f"{rel} on {self.view.name} differs from {self.owner.name}'s")
            else:
                good += 1
        return good, bad


def temp_files(directory):
    """Temporary files of an unfinished fetch (.<name>.dyad-*) below `directory`."""
    return glob.glob(os.path.join(directory, "**", ".*.dyad-*"), recursive=True)


def wait_waiting(cluster, consumers, timeout=60):
    """Until every consumer waits in its metadata store (the embedded
    store's host counts all of them; with etcd, each node its own)."""
    per_host = collections.Counter(c.view.store_host().name for c in consumers)
    by_name = {c.view.store_host().name: c.view.store_host() for c in consumers}
    procs = [c.proc for c in consumers]
    for name, count in per_host.items():
        by_name[name].wait_waiters(count, procs=procs, timeout=timeout)


def service_load(nodes):
    """(descriptors, RSS KiB) of each running dyadd."""
    out = {}
    for n in nodes:
        fds = n.fd_count()
        if fds is not None:
            out[n.name] = (fds, harness.rss_kib(n.service_pid()))
    return out


def listed_count(node, prefix="scale/"):
    out = node.dyad("--json", "ls", prefix, timeout=120).stdout
    try:
        return len(json.loads(out))
    except json.JSONDecodeError:
        return sum(1 for line in out.splitlines() if line.strip())


def exchange(c, files):
    """The exchange on a started cluster; returns the phase timings."""
    n = len(c.nodes)
    js = range(files)
    t = {"start": time.monotonic()}
    consumers = [Consumer(c[cons], c[owner], js) for owner, cons in plan(n)]
    wait_waiting(c, consumers)
    t["waiting"] = time.monotonic()
    failed = produce(c.nodes, js)
    assert not failed, f"produce failed on {len(failed)} node(s): {failed[:3]}"
    t["produced"] = time.monotonic()
    for k in consumers:
        rc = k.finish(WAIT + 60)
        assert rc == 0, f"{k.view.name} consuming {k.owner.name}'s files failed ({rc}): {k.err[-1000:]}"
        reports = [json.loads(line) for line in k.out.splitlines()]
        assert len(reports) == files and all(r["action"] == "fetched" for r in reports), k.out[-1000:]
        good, bad = k.check_files()
        assert not bad and good == files, (bad[:3], good)
    t["consumed"] = time.monotonic()
    for node in c.nodes:
        assert not temp_files(node.dir), f"temporary files left on {node.name}: {temp_files(node.dir)[:3]}"
    for node in (c[0], c[n - 1]):
        assert listed_count(node) == n * files, f"{node.name} does not list all {n * files} records"
    return t


def run_exchange(make_cluster, nodes, store, files, **kw):
    t0 = time.monotonic()
    c = make_cluster(nodes, store, **kw)
    started = time.monotonic() - t0
    t = exchange(c, files)
    load = service_load(c.nodes)
    fds = sorted(v[0] for v in load.values())
    rss = sorted(v[1] for v in load.values())
    copies = 2 * nodes * files
    print(f"\n{nodes} nodes, {store}{' x' + str(kw.get('etcd_members')) if kw.get('etcd_members') else ''}: "
          f"cluster up {started:.1f}s; consumers waiting {t['waiting'] - t['start']:.1f}s; "
          f"produce {t['produced'] - t['waiting']:.1f}s; all {copies} copies in {t['consumed'] - t['waiting']:.1f}s "
          f"({copies / (t['consumed'] - t['waiting']):.0f} files/s); dyadd fds median {fds[len(fds) // 2]} "
          f"max {fds[-1]}; RSS median {rss[len(rss) // 2] // 1024} MiB max {rss[-1] // 1024} MiB")
    return c


def test_sixteen_nodes_etcd_cluster(make_cluster):
    """16 nodes on a 3-member etcd cluster: ring and random pairs, 50 files
    each (one over 1 MiB), consumers waiting first."""
    c = run_exchange(make_cluster, 16, "etcd", 50, etcd_members=3)
    st = c.etcd.status()
    assert len(st) == 3, f"not every etcd member answers: {st}"
    status = c[5].status()
    assert ",".join(c.etcd.endpoints) in json.dumps(status), "a dyadd does not know all three etcd members"
    # The services spread over the members (each picks one at random): not
    # all on the first (with 16 services at random, a member serves 13 or more
    # with a probability of about 3e-4).
    streams = {m.name: watch_streams(c.etcd, m) for m in c.etcd.members}
    print(f"watch streams per etcd member: {streams}")
    assert sum(streams.values()) == 16, streams
    assert max(streams.values()) <= 12, f"the dyadds crowd on one etcd member: {streams}"


def watch_streams(etcd, member):
    """The watch streams an etcd member serves (one per dyadd that uses it)."""
    m = re.search(r"^etcd_debugging_mvcc_watch_stream_total (\S+)$", etcd.metrics(member), re.M)
    return int(float(m.group(1)))


def test_sixteen_nodes_embedded(make_cluster):
    """The same 16-node exchange with node0's embedded store holding every
    record and every wait."""
    run_exchange(make_cluster, 16, "embedded", 50)


def test_etcd_leader_killed(make_cluster):
    """The etcd leader is killed (SIGKILL) while consumers on 4 nodes wait:
    the dyadds fail over to the other members (etcd://A,B,C), records
    published before and after the kill are all served, and the killed
    member rejoins."""
    c = make_cluster(4, "etcd", etcd_members=3)
    first, second = range(5), range(5, 10)
    consumers = [Consumer(c[cons], c[owner], range(10)) for owner, cons in plan(4)[:4]]
    wait_waiting(c, consumers)
    assert not produce(c.nodes, first)
    harness.wait_for(lambda: all(k.arrived(first) or k.proc.poll() is not None for k in consumers), WAIT,
                     what="the first files to arrive")
    leader = c.etcd.kill_leader()
    new = c.etcd.leader()
    assert new is not leader
    assert not produce(c.nodes, second)
    for k in consumers:
        assert k.finish(WAIT + 60) == 0, k.err
        assert k.check_files() == (10, [])
    leader.start()
    assert len(c.etcd.status()) == 3


def test_consumers_service_killed_while_waiting(make_cluster):
    """Found by the chaos test: a consumer waits through its own service
    (with etcd, the service is its metadata store); that service is killed
    and the file is then produced on another node. The consumer's error must
    name its unreachable service, not say the file was not produced."""
    c = make_cluster(2, "etcd")
    k = Consumer(c[1], c[0], [0], wait=4)
    wait_waiting(c, [k])
    c[1].kill()
    assert not produce([c[0]], [0])
    rc = k.finish(60)
    assert rc not in (0, None), k.err
    assert "was not produced" not in k.err and c[1].uri in k.err, k.err


# --- 64 nodes (make test-long) ------------------------------------------------


@pytest.mark.long
def test_sixty_four_nodes_etcd_cluster(make_cluster):
    run_exchange(make_cluster, 64, "etcd", 20, etcd_members=3)


def ns_pids(ns):
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return {int(p) for p in r.stdout.split()}


@pytest.mark.long
def test_chaos_at_sixty_four_nodes(make_cluster, tmp_path):
    """During a 64-node exchange on a 3-member etcd: 6 services killed with
    SIGKILL (3 come back), one node's link cut for 20 s, the etcd leader
    killed, one consumer's disk full. Afterwards every consumer has each file
    byte-identical or ended with a clear error within its deadline; nothing
    temporary or partial stays; the services that came back are registered
    again and serve their unchanged files; no descriptor or process leaked."""
    n, files, half = 64, 16, 8
    c = make_cluster(n, "etcd", etcd_members=3, dyadd_args=["--lease-ttl", "5"])
    rng = random.Random(64)
    pool = list(range(1, n))
    rng.shuffle(pool)
    back, dead, cut, full = pool[0:3], pool[3:6], pool[6], pool[7]
    killed = set(back) | set(dead)
    pairs = plan(n)
    js = range(files)
    events = []  # (seconds from the start, fault, outcome)
    t0 = time.monotonic()

    def note(what, outcome=""):
        events.append((time.monotonic() - t0, what, outcome))

    # The full disk: `full`'s consumers write into a 512 KiB tmpfs (each
    # owner's file 7 is over 1 MiB).
    full_dir = str(tmp_path / "full")
    with harness.small_tmpfs(full_dir, "512k"):
        full_view = harness.NodeView(c[full], full_dir)
        consumers = [Consumer(full_view if cons == full else c[cons], c[owner], js) for owner, cons in pairs]
        wait_waiting(c, [k for k in consumers if k.view is not full_view])
        note("consumers waiting", f"{len(consumers)} consumers, {files} files each")
        assert not produce(c.nodes, range(half))
        harness.wait_for(lambda: all(k.arrived(range(half)) or k.proc.poll() is not None for k in consumers
                                     if k.view is not full_view), WAIT, what="the first half to arrive")
        note("first half produced and consumed")
        survivors = [x for x in c.nodes if x.index not in killed]
        fds_before = {x.name: x.fd_count() for x in survivors}

        for i in sorted(killed):
            c[i].kill()
        note("kill -9 dyadd", f"{len(killed)} services: {sorted(killed)} ({sorted(back)} come back)")
        c[cut].set_link(False)
        note("link down", f"node{cut} cut off")
        leader = c.etcd.kill_leader()
        note("etcd leader killed", f"{leader.name}; new leader {c.etcd.leader().name}")
        live = [x for x in c.nodes if x.index not in killed and x.index != cut]
        failed = produce(live, range(half, files))
        note("second half produced", f"{len(live)} nodes; failures: {len(failed)}")
        leader.start()
        note("etcd member restarted", f"{leader.name}: {len(c.etcd.status())} members answer")
        c.start_nodes([c[i] for i in back])
        failed += produce([c[i] for i in back], range(half, files))
        note("services restarted", f"{sorted(back)} answer; they produced their second half")
        left = 20 - (time.monotonic() - t0 - next(t for t, w, _ in events if w == "link down"))
        if left > 0:
            time.sleep(left)  # the fault's duration: the link stays down 20 s
        c[cut].set_link(True)
        note("link up", f"node{cut} back after 20 s")
        failed += produce([c[cut]], range(half, files))
        note("cut node produced", "its second half")
        assert not failed, failed

        # Every consumer ends within its deadline: whole files or clear errors.
        def category(k):
            if k.view is full_view:
                return "consumer's disk full"
            if k.view.index in killed:
                return "consumer's service killed"
            if k.owner.index in dead:
                return "owner killed for good"
            if k.owner.index in back:
                return "owner killed, came back"
            if cut in (k.owner.index, k.view.index):
                return "owner or consumer cut 20 s"
            return "untouched (etcd leader lost)"

        table = collections.defaultdict(lambda: {"whole": 0, "error": 0, "max_s": 0.0, "sample": ""})
        problems = []
        # When each ends (their output is a few lines: the pipes do not fill).
        limit = time.monotonic() + WAIT + 120
        while not all([k.poll_ended() for k in consumers]) and time.monotonic() < limit:
            time.sleep(0.2)  # the poll interval (every consumer polled each round)
        for k in consumers:
            cat = category(k)
            try:
                rc = k.finish(WAIT + 120)
            except subprocess.TimeoutExpired:
                k.proc.kill()
                k.proc.communicate()
                problems.append(f"{k.view.name} <- {k.owner.name}: still running past its deadline")
                continue
            good, bad = k.check_files()
            problems += bad
            row = table[cat]
            row["max_s"] = max(row["max_s"], k.took)
            if k.took > k.deadline + 30:
                problems.append(f"{k.view.name} <- {k.owner.name} ended after {k.took:.0f} s, past its "
                                f"deadline of {k.deadline} s")
            must = cat in ("untouched (etcd leader lost)", "owner or consumer cut 20 s", "owner killed, came back")
            if rc == 0:
                row["whole"] += 1
                if good != files:
                    problems.append(f"{k.view.name} <- {k.owner.name}: rc 0 with {good}/{files} files")
            elif rc < 0 or not k.err.strip():
                problems.append(f"{k.view.name} <- {k.owner.name}: rc {rc} without an error message")
            else:
                row["error"] += 1
                last = [line for line in k.err.strip().splitlines() if line.strip()][-1]
                row["sample"] = row["sample"] or f"rc {rc}, {good}/{files} files: ...{last[-200:]}"
                if must:
                    problems.append(f"{k.view.name} <- {k.owner.name} ({cat}) should have succeeded: rc {rc}: "
                                    f"{k.err.strip()[-400:]}")
                if cat == "consumer's disk full" and "space" not in k.err.lower():
                    problems.append(f"the full consumer's error does not say so: {k.err.strip()[-300:]}")
        note("consumers ended", f"{sum(r['whole'] for r in table.values())} whole, "
                                f"{sum(r['error'] for r in table.values())} clear errors")
        leftovers = [p for x in c.nodes for p in temp_files(x.dir)] + temp_files(full_dir)
        assert not leftovers, f"temporary files left: {leftovers[:5]}"

    # Services that came back are registered and serve their unchanged files.
    for i in back:
        assert registered(c.etcd, c[i].name), f"node{i} is not registered again"
        view = harness.NodeView(c[0] if i != 0 else c[1], os.path.join(c.root, f"late-from{i}"))
        k = Consumer(view, c[i], js)
        assert k.finish(WAIT) == 0, k.err
        assert k.check_files() == (files, [])
    view = harness.NodeView(c[0], os.path.join(c.root, f"late-from{cut}"))
    k = Consumer(view, c[cut], js)
    assert k.finish(WAIT) == 0, k.err
    assert k.check_files() == (files, [])
    note("came back", f"{sorted(back)} and node{cut} registered, serve all {files} files")

    # No leaked descriptor nor process: each survivor holds at most what it
    # held before the faults (its connections to the killed owners are gone)
    # plus a few, once the consumers are gone; no process but the dyadd.
    def fds_settled():
        now = {x.name: x.fd_count() for x in survivors}
        return now if all(now[k] <= fds_before[k] + 4 for k in now) else None

    try:
        fds_after = harness.wait_for(fds_settled, 30, what="descriptors back to their level", interval=0.5)
    except TimeoutError:
        fds_after = {x.name: x.fd_count() for x in survivors}
    grew = {k: (fds_before[k], fds_after[k]) for k in fds_after if fds_after[k] > fds_before[k] + 4}
    note("descriptors", f"before {sum(fds_before.values())}, after {sum(fds_after.values())} over "
                        f"{len(survivors)} survivors")
    strays = {}
    for x in c.nodes:
        pids = ns_pids(c.net.namespaces[x.member])
        own = {x.service_pid()} if x.proc else set()
        if pids - own:
            strays[x.name] = pids - own
    print("\nchaos at 64 nodes: faults injected and outcomes")
    print(f"{'t (s)':>7}  {'event':<34} outcome")
    for t, what, outcome in events:
        print(f"{t:7.1f}  {what:<34} {outcome}")
    print(f"\n{'consumers (owner <- consumer)':<32} {'whole':>5} {'error':>5} {'max s':>6}  error (last line)")
    for cat, row in sorted(table.items()):
        print(f"{cat:<32} {row['whole']:>5} {row['error']:>5} {row['max_s']:6.1f}  {row['sample']}")
    assert not grew, f"descriptors grew (before, after): {grew}"
    assert not strays, f"processes left in the namespaces: {strays}"
    assert not problems, f"{len(problems)} problem(s): " + "\n".join(problems[:20])


def registered(etcd, service):
    keys = etcd.ctl("get", "--prefix", "/", "--keys-only").stdout.split()
    return any(k.endswith(f"/services/{service}") for k in keys)
