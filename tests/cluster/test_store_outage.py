# SPDX-License-Identifier: Apache-2.0
"""The metadata store unreachable (issue 33, item 1): etcd killed, or the
dyadd hosting the embedded store stopped. While it is down every dyadd keeps
answering `dyad service status`, /healthz and /metrics and says the store is
down (endpoint, since when); a consumer with a deadline gets an error that
names the store, not "not produced" nor "not a DYAD service"; consumers
waiting, or started, during the outage get their files once the store is
back within their deadlines; the dyadd logs the outage and the recovery once.
"""
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request

import harness

WAIT = 120  # a consumer's deadline that outlasts every outage here
STATUS = 15  # seconds a status may take: far more than an answering loop needs


def start_with_metrics(c):
    for n in c.nodes:
        n.metrics_port = harness.free_port("127.0.0.1" if c.mode == "netns" else n.host)
        n.start(["--metrics-listen", f"{n.host}:{n.metrics_port}"])


def http_get(node, path):
    """(status, body) of GET path on the node's metrics endpoint (run inside
    its namespace, as a scraper on that node would)."""
    code = ("import sys, urllib.request, urllib.error\n"
            "try:\n"
            "    r = urllib.request.urlopen(sys.argv[1], timeout=10)\n"
            "    print(r.status); sys.stdout.write(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code); sys.stdout.write(e.read().decode())\n")
    url = f"http://{node.host}:{node.metrics_port}{path}"
    p = subprocess.run(node.prefix + ["/usr/bin/python3", "-c", code, url], capture_output=True, text=True,
                       timeout=STATUS + 5)
    assert p.returncode == 0, f"GET {url} failed: {p.stderr}"
    first, _, body = p.stdout.partition("\n")
    return int(first), body


def metric(text, name):
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in the metrics:\n{text[:2000]}"
    return float(m.group(1))


def status(node):
    """The node's service status: it must answer within STATUS seconds."""
    p = node.dyad("--json", "service", "status", check=False, timeout=STATUS)
    assert p.returncode == 0, f"{node.name}: dyad service status failed ({p.returncode}): {p.stderr}"
    return json.loads(p.stdout)


def wait_store_down(node):
    return harness.wait_for(lambda: (lambda s: s if not s["metadata_store"]["reachable"] else None)(status(node)),
                            20, what=f"{node.name}'s status to say the store is down", interval=0.2)


def consume_async(node, rel, timeout):
    return node.dyad_async("--json", "consume", "--timeout", str(timeout), node.path(rel))


def check_got(cons, owner, rel, proc):
    out, err = proc.communicate(timeout=WAIT + 30)
    assert proc.returncode == 0, f"{cons.name} consuming {rel} failed ({proc.returncode}): {err}"
    assert harness.sha256(cons.path(rel)) == harness.sha256(owner.path(rel)), rel


HOLDER = """
import sys
from pydyad import Dyad
d = Dyad()
d.init_env()
m = d.get_metadata(sys.argv[1], should_wait=True)
print("held", flush=True)
sys.stdin.readline()
d.consume_w_metadata(sys.argv[1], m)
print("fetched", flush=True)
"""


def hold_record(node, rel):
    """A pydyad consumer on `node` that gets the record of `rel` now and
    fetches it with that record (consume_w_metadata: no lookup) when told."""
    env = node.env()
    env["PYTHONPATH"] = os.path.join(harness.ROOT, "python")
    env["DYAD_LIBRARY"] = os.path.join(harness.BUILD, "lib", "libdyad.so")
    env["DYAD_WAIT_TIMEOUT"] = str(WAIT)
    p = subprocess.Popen(node.prefix + ["/usr/bin/python3", "-c", HOLDER, node.path(rel)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line == "held\n", f"the record of {rel} was not had: {line!r} {p.communicate(timeout=30)}"
    return p


def log_text(node):
    with open(node.log_path, errors="replace") as f:
        return f.read()


def test_etcd_outage(make_cluster):
    """etcd killed (SIGKILL) and started again."""
    c = make_cluster(2, "etcd", start=False)
    c.etcd.start()
    start_with_metrics(c)
    prod, cons = c[0], c[1]
    uri = c.etcd.uri
    prod.produce_text("before.txt", "published before the outage\n")
    # One consumer waits for a file not produced yet: it rides through.
    rider = harness.NodeView(cons, os.path.join(c.root, "rider"))
    waiting = consume_async(rider, "during.txt", WAIT)
    cons.wait_waiters(1, procs=[waiting])
    prod.produce_text("held.txt", "its record is held by a consumer\n")
    holder_node = harness.NodeView(cons, os.path.join(c.root, "holder"))
    holder = hold_record(holder_node, "held.txt")

    c.etcd.kill()
    for n in (prod, cons):
        st = wait_store_down(n)["metadata_store"]
        assert st["endpoint"] == c.etcd.endpoint, st
        assert uri in st["error"] and "unreachable since" in st["error"], st
        assert st["unreachable_since"] and st["store_errors"] >= 1, st
        code, body = http_get(n, "/healthz")
        assert code == 503, (code, body)
        assert f"metadata store at {uri} unreachable since" in body, body
        code, text = http_get(n, "/metrics")
        assert code == 200, (code, text[:500])
        assert metric(text, "dyad_store_up") == 0
        assert metric(text, "dyad_store_errors_total") >= 1
        assert metric(text, "dyad_store_outages_total") == 1

    # A consumer holding the record fetches the file without the store.
    out, err = holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0 and out == "fetched\n", (out, err)
    assert harness.sha256(holder_node.path("held.txt")) == harness.sha256(prod.path("held.txt"))

    # A consumer with a short deadline, of a file that was produced: the
    # error names the store, not a missing file or a dead service.
    late = harness.NodeView(cons, os.path.join(c.root, "late"))
    p = late.dyad("consume", "--timeout", "3", late.path("before.txt"), check=False, timeout=60)
    assert p.returncode != 0
    assert f"the metadata store at {uri} is unreachable since" in p.stderr, p.stderr
    assert "DYAD retried until the wait's deadline (--timeout)" in p.stderr, p.stderr
    assert "produce it first" not in p.stderr and "did not answer like a DYAD service" not in p.stderr, p.stderr

    # A consumer started while the store is down waits for it.
    started_down = harness.NodeView(cons, os.path.join(c.root, "started_down"))
    p2 = consume_async(started_down, "before.txt", WAIT)

    # A publish during the outage waits for the store (its own 30 s).
    with open(prod.path("rode.txt"), "w") as f:
        f.write("published through the outage\n")
    publishing = prod.dyad_async("produce", prod.path("rode.txt"))

    c.etcd.start()
    out, err = publishing.communicate(timeout=60)
    assert publishing.returncode == 0, err
    prod.produce_text("during.txt", "published after the store came back\n")
    check_got(rider, prod, "during.txt", waiting)
    check_got(started_down, prod, "before.txt", p2)
    check_got(late, prod, "rode.txt", late.dyad_async("consume", "--timeout", str(WAIT), late.path("rode.txt")))
    code, text = http_get(cons, "/metrics")
    assert metric(text, "dyad_kvs_store_down_total") >= 1, text[:500]
    for n in (prod, cons):
        st = harness.wait_for(lambda: (lambda s: s if s["metadata_store"]["reachable"] else None)(status(n)), 20,
                              what=f"{n.name}'s store reachable again", interval=0.2)
        assert st["metadata_store"]["store_outages"] == 1
        assert http_get(n, "/healthz") == (200, "ok\n")
        log = log_text(n)
        assert log.count(f"metadata store at {uri} unreachable since") == 1, log[-3000:]
        # Not once per request refused meanwhile (the consumers asked again and again).
        assert f"{uri} is unreachable since" not in log, log[-3000:]
        assert re.search(rf"metadata store at {re.escape(uri)} reachable again after [0-9.]+ s; \d+ waits resumed",
                         log), log[-3000:]


def test_embedded_store_host_stopped(make_cluster):
    """The dyadd hosting the embedded store stopped (SIGSTOP: it holds its
    connections and answers nothing) and continued; then killed outright
    while a consumer starts."""
    c = make_cluster(3, "embedded", start=False)
    start_with_metrics(c)
    host, prod, cons = c[0], c[1], c[2]
    prod.produce_text("before.txt", "published before the outage\n")
    host.proc.send_signal(signal.SIGSTOP)
    try:
        for n in (prod, cons):
            st = wait_store_down(n)["metadata_store"]
            assert host.uri in st["error"], st
            assert st["unreachable_since"] and st["store_errors"] >= 1, st
            code, body = http_get(n, "/healthz")
            assert code == 503 and f"metadata store at {host.uri} unreachable since" in body, (code, body)
            code, text = http_get(n, "/metrics")
            assert code == 200 and metric(text, "dyad_store_up") == 0, text[:500]
    finally:
        host.proc.send_signal(signal.SIGCONT)
    harness.wait_for(lambda: status(cons)["metadata_store"]["reachable"], 20, what="store reachable again",
                     interval=0.2)
    assert re.search(rf"metadata store at {re.escape(host.uri)} reachable again after [0-9.]+ s", log_text(cons))

    # Killed: a consumer started now waits (within its deadline) instead of
    # failing at once; it gets its file once the host is back and the
    # producer's service has published it again.
    host.kill()
    fresh = harness.NodeView(cons, os.path.join(c.root, "fresh"))
    p = consume_async(fresh, "before.txt", WAIT)
    quick = harness.NodeView(cons, os.path.join(c.root, "quick"))
    q = quick.dyad("consume", "--timeout", "2", quick.path("before.txt"), check=False, timeout=60)
    assert q.returncode != 0
    assert f"the metadata store at {host.uri} is unreachable" in q.stderr, q.stderr
    assert "DYAD retried until the wait's deadline (--timeout)" in q.stderr, q.stderr
    assert p.poll() is None, f"the consumer started while the store host was down ended: {p.communicate()}"
    host.start(["--metrics-listen", f"{host.host}:{host.metrics_port}"])
    check_got(fresh, prod, "before.txt", p)
