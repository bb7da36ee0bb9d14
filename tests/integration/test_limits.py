# SPDX-License-Identifier: Apache-2.0
"""What a peer can take from a service (docs/security.md, "Protecting the
service from its peers"): quotas of the embedded metadata store per
namespace, and the idle timeout of connections (with the pooled client
connections that must not notice it)."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

import harness
from rawwire import ERROR, Raw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def limited():
    """node0 hosts the store with a quota of 3 records a namespace and an
    idle timeout of 1 s; node1 uses it."""
    c = harness.Cluster(nodes=2, start=False)
    try:
        c[0].start(["--store-max-records-per-namespace", "3", "--idle-timeout", "1"])
        c[1].start()
    except Exception:
        c.cleanup()
        raise
    yield c
    c.cleanup()


def write(node, name, text="x"):
    path = node.path(name)
    with open(path, "w") as f:
        f.write(text)
    return path


def test_a_namespace_over_its_record_quota_is_refused_with_the_option(limited):
    prod, cons = limited[1], limited[0]
    for i in range(3):
        prod.dyad("produce", write(prod, f"q{i}.txt"))
    # Publishing one again replaces its record: not a new one.
    prod.dyad("produce", write(prod, "q0.txt", "changed"))
    p = prod.dyad("produce", write(prod, "q3.txt"), check=False)
    assert p.returncode != 0
    assert "namespace 'dyad'" in p.stderr, p.stderr
    assert "quota of 3 records" in p.stderr, p.stderr
    assert "--store-max-records-per-namespace" in p.stderr, p.stderr
    # Another namespace has its own quota; the registry was not affected.
    other = {"DYAD_KVS_NAMESPACE": "other"}
    prod.dyad("produce", write(prod, "o0.txt", "other ns"), env_extra=other)
    cons.dyad("consume", cons.path("o0.txt"), env_extra=dict(other, DYAD_WAIT_TIMEOUT=20))
    with open(cons.path("o0.txt")) as f:
        assert f.read() == "other ns"
    st = cons.status()["store"]
    assert st["refused_namespace_records"] == 1, st
    assert st["max_records_per_namespace"] == 3
    assert st["refused"] >= 1


def test_an_idle_connection_is_closed_and_counted(limited):
    node = limited[0]
    before = node.status()["counters"]["idle_closed"]
    r = Raw.to(node)
    start = time.monotonic()
    with pytest.raises((ConnectionError, OSError)):
        r.recv()  # nothing asked: the service closes it after ~1 s
    took = time.monotonic() - start
    assert 0.8 <= took < 5, took
    # A connection with a request in flight is not idle.
    busy = Raw.to(node)
    tag = busy.request("kvs.get", ns="dyad", key="never-produced", wait=True, timeout_ms=2500)
    f, _ = busy.collect(tag)
    assert f["type"] == ERROR and f["errnum"] == 110, f  # its own deadline, not a close
    harness.wait_for(lambda: node.status()["counters"]["idle_closed"] >= before + 1,
                     what="idle_closed counted")


def test_a_pooled_connection_closed_while_idle_is_not_an_error(limited):
    prod, cons = limited[1], limited[0]
    for name in ("p1.txt", "p2.txt"):
        with open(prod.path(name), "w") as f:
            f.write(name)
    before = cons.status()["counters"]["idle_closed"]
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        d.produce({prod.path('p1.txt')!r})
        d.produce({prod.path('p2.txt')!r})
        print("produced", flush=True)
    """)
    env = prod.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        d.consume({cons.path('p1.txt')!r})
        time.sleep(2)  # the service closes the pooled connections meanwhile
        d.consume({cons.path('p2.txt')!r})
        print("consumed", flush=True)
    """)
    env = cons.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"),
                   DYAD_WAIT_TIMEOUT=20)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "consumed" in p.stdout
    with open(cons.path("p2.txt")) as f:
        assert f.read() == "p2.txt"
    assert cons.status()["counters"]["idle_closed"] >= before + 1


def test_warnings_about_bad_peers_are_rate_limited(limited):
    """60 connections that send a frame that is no frame each get dropped,
    but the log takes at most 20 warnings about peers every 10 s; the next
    one after the window says how many were left out."""
    import socket

    node = limited[0]

    def bad_frame():
        with socket.create_connection((node.host, node.port), timeout=5) as s:
            s.sendall(b"NOTAFRAME" * 4)
            try:
                s.recv(4096)  # the service's answer, or the close
            except OSError:
                pass

    for _ in range(60):
        bad_frame()

    def dropped():
        with open(node.log_path, errors="replace") as f:
            return sum("dropping connection" in line for line in f)

    assert 0 < dropped() <= 20, dropped()
    time.sleep(10.5)
    bad_frame()
    harness.wait_for(lambda: "were left out of the log" in open(node.log_path, errors="replace").read(), 10,
                     what="the summary of the warnings left out")
    assert "counters" in node.status()  # still serving
