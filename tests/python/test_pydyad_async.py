# SPDX-License-Identifier: Apache-2.0
"""pydyad with DYAD_ASYNC_PUBLISH=1 (issue 48): produce() returns once the
file is queued, every file arrives identical on the other node, and a
publish that failed is raised by the next call and by finalize()."""
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from pydyad_testlib import _code, harness, pyenv


class Proc:
    def __init__(self, node, body, **extra):
        code = textwrap.dedent(PRODUCER) + textwrap.dedent(body)
        self.p = subprocess.Popen([sys.executable, "-c", _code(code)],
                                  env=pyenv(node, DYAD_ASYNC_PUBLISH=1, **extra), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(l.rstrip("\n")) for l in self.p.stdout] and None,
                         daemon=True).start()

    def line(self, timeout=30):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            self.p.kill()
            raise AssertionError(f"no line within {timeout} s; stderr: {self.p.stderr.read()[-2000:]}") from None

    def send(self, word):
        self.p.stdin.write(word + "\n")
        self.p.stdin.flush()


@pytest.fixture
def nodes():
    c = harness.Cluster(nodes=3)
    yield c
    for n in c.nodes:
        if n.proc and n.proc.poll() is None:
            os.kill(n.service_pid(), signal.SIGCONT)
    c.cleanup()


PRODUCER = """
    def say(x):
        print(json.dumps(x), flush=True)
    d = Dyad(); d.init_env()  # connects to the service (its rank)
    D = d.prod_path
    def write(rel, b):
        with open(os.path.join(D, rel), "wb") as f:
            f.write(b)
    def attempt(f):
        try:
            f()
            return "ok"
        except DyadError as e:
            return e.rc_name + ": " + e.message
    say("ready"); sys.stdin.readline()
"""


def test_produce_returns_queued_and_files_arrive_identical(nodes):
    prod, cons = nodes[1], nodes[2]
    p = Proc(prod, """
        for i in range(12):
            write(f"p{i}", os.urandom(1000 * i))
            d.produce(os.path.join(D, f"p{i}"))
        say("queued")
        d.finalize()
        say("done")
    """)
    assert p.line() == '"ready"'
    os.kill(prod.service_pid(), signal.SIGSTOP)
    p.send("go")
    assert p.line(timeout=20) == '"queued"'  # with the service stopped
    os.kill(prod.service_pid(), signal.SIGCONT)
    assert p.line() == '"done"'
    assert p.p.wait(timeout=60) == 0
    rels = [f"p{i}" for i in range(12)]
    cons.dyad("consume", *[cons.path(r) for r in rels], env_extra={"DYAD_WAIT_TIMEOUT": 30})
    for r in rels:
        assert harness.sha256(cons.path(r)) == harness.sha256(prod.path(r)), r


def test_failed_publish_raises_on_the_next_call_and_on_finalize(nodes):
    prod, cons = nodes[1], nodes[2]
    p = Proc(prod, """
        write("gone", b"g")
        write("after", b"a")
        d.produce(os.path.join(D, "gone"))
        d.produce(os.path.join(D, "after"))
        say("queued"); sys.stdin.readline()
        write("next", b"n")
        say(attempt(lambda: d.produce(os.path.join(D, "next"))))
        say(attempt(lambda: d.produce(os.path.join(D, "next"))))
        sys.stdin.readline()
        write("last", b"l")
        d.produce(os.path.join(D, "last"))
        say(attempt(d.finalize))
    """)
    assert p.line() == '"ready"'
    os.kill(prod.service_pid(), signal.SIGSTOP)
    p.send("go")
    assert p.line(timeout=20) == '"queued"'
    os.unlink(prod.path("gone"))
    os.kill(prod.service_pid(), signal.SIGCONT)
    # Published in order: once after's record is there, gone's publish failed.
    harness.wait_for(lambda: cons.dyad("stat", cons.path("after"), check=False).returncode == 0, 30,
                     what="after's record")
    p.send("next")
    first = json.loads(p.line())
    assert first.startswith("DYAD_RC_") and "gone" in first and "not carried out" in first, first
    assert json.loads(p.line()) == "ok"
    # next's publish is queued, not done: wait for its record before the
    # service goes, or its failure would be the one the next call reports.
    harness.wait_for(lambda: cons.dyad("stat", cons.path("next"), check=False).returncode == 0, 30,
                     what="next's record")
    prod.kill()
    p.send("last")
    last = json.loads(p.line(timeout=90))
    assert last.startswith("DYAD_RC_") and "last" in last, last
    assert p.p.wait(timeout=60) == 0
