# SPDX-License-Identifier: Apache-2.0
"""DYAD_ASYNC_PUBLISH=1 through the C API and the LD_PRELOAD wrapper (issue
48): node0 hosts the metadata store, node1 produces, node2 consumes. The
producer's service is stopped (SIGSTOP) while files are queued, so that each
test sees the calls return before their publishes are answered."""
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import harness

LIBDYAD = os.environ.get("DYAD_LIBRARY") or os.path.join(harness.BUILD, "lib", "libdyad.so")
WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
PY = sys.executable

# A producer over the C API (ctypes on libdyad.so): initialised from the
# environment, its connection to its service made (dyad_init_env asks the
# service its rank), before the test stops that service.
CAPI = r"""
import ctypes, json, os, sys, time
lib = ctypes.CDLL(os.environ["DYAD_LIBRARY"])
lib.dyad_last_error.restype = ctypes.c_char_p
lib.dyad_ctx_get.restype = ctypes.c_void_p
lib.dyad_produce.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
assert lib.dyad_init_env(1, None) == 0, lib.dyad_last_error()
ctx = lib.dyad_ctx_get()
D = os.environ["DYAD_PATH_PRODUCER"]

def say(*a):
    print(*a, flush=True)

def wait(word):
    line = sys.stdin.readline().strip()
    assert line == word, (line, word)

def err():
    return (lib.dyad_last_error() or b"").decode()

def produce(rel):
    rc = lib.dyad_produce(ctx, os.path.join(D, rel).encode())
    return rc, err()

def data(i, size):
    return bytes((i * 7 + k) % 251 for k in range(251)) * (size // 251) + bytes(size % 251)

def write(rel, b):
    p = os.path.join(D, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(b)

def finalize():
    rc = lib.dyad_finalize()
    return rc, err()
"""


class Proc:
    """A process whose stdout lines are read as they come."""

    def __init__(self, args, env):
        self.p = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.err = []
        threading.Thread(target=self._pump, args=(self.p.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.p.stderr, lambda l: l is not None and self.err.append(l)),
                         daemon=True).start()

    @staticmethod
    def _pump(f, put):
        for line in f:
            put(line.rstrip("\n"))
        put(None)

    def line(self, timeout=30):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s; stderr: {self.tail()}") from None
        assert line is not None, f"the process ended (rc {self.p.wait()}); stderr: {self.tail()}"
        return line

    def expect(self, word, timeout=30):
        line = self.line(timeout)
        assert line == word, (line, word, "\n".join(self.err)[-2000:])

    def send(self, word):
        self.p.stdin.write(word + "\n")
        self.p.stdin.flush()

    def wait(self, timeout=60):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise AssertionError(f"the process did not end within {timeout} s; stderr: {self.tail()}")

    def tail(self):
        return "\n".join(self.err)[-2000:]

    def stderr(self):
        self.p.wait(timeout=60)
        time.sleep(0.1)  # the pump's last lines
        return "\n".join(self.err)


def capi(node, code, **extra):
    env = node.env(DYAD_ASYNC_PUBLISH=1, DYAD_LIBRARY=LIBDYAD, **extra)
    env.update(harness.sanitizer_runtime_env(LIBDYAD))
    return Proc([PY, "-c", CAPI + textwrap.dedent(code)], env)


@pytest.fixture
def nodes():
    c = harness.Cluster(nodes=3)
    yield c
    for n in c.nodes:  # a test that failed with a service stopped
        if n.proc and n.proc.poll() is None:
            os.kill(n.service_pid(), signal.SIGCONT)
    c.cleanup()


def stop(node):
    os.kill(node.service_pid(), signal.SIGSTOP)


def cont(node):
    os.kill(node.service_pid(), signal.SIGCONT)


def record(node, rel):
    """The record of rel seen from `node` (no wait), or None."""
    p = node.dyad("--json", "stat", node.path(rel), check=False)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)


def consume_same(cons, prod, rels):
    cons.dyad("consume", *[cons.path(r) for r in rels], env_extra={"DYAD_WAIT_TIMEOUT": 30})
    for r in rels:
        assert harness.sha256(cons.path(r)) == harness.sha256(prod.path(r)), r


SIZES = [0, 1, 4096, 65536 + 3, 300000]


def test_capi_calls_return_queued_and_every_file_arrives_identical(nodes):
    prod, cons = nodes[1], nodes[2]
    p = capi(prod, """
        say("ready"); wait("go")
        rcs = []
        for i in range(20):
            write(f"a/f{i}", data(i, [0, 1, 4096, 65539, 300000][i % 5]))
            rcs.append(produce(f"a/f{i}")[0])
        say("queued " + json.dumps(rcs))
        say(json.dumps(finalize()))
    """)
    p.expect("ready")
    stop(prod)
    p.send("go")
    # Every call returned while the service could not answer.
    assert p.line(timeout=20) == "queued " + json.dumps([0] * 20)
    cont(prod)
    assert json.loads(p.line()) == [0, ""]
    assert p.wait() == 0
    consume_same(cons, prod, [f"a/f{i}" for i in range(20)])


def test_rewrite_while_queued_is_never_seen_half(nodes):
    prod, cons = nodes[1], nodes[2]
    size = 1 << 20
    p = capi(prod, """
        say("ready"); wait("go")
        write("r.bin", b"A" * %d)
        say("queued %%d" %% produce("r.bin")[0]); wait("rewrite")
        f = open(os.path.join(D, "r.bin"), "wb")  # waits while its publish is in flight
        f.write(b"B" * %d); f.flush()
        say("half"); wait("finish")
        f.write(b"B" * %d); f.close()
        rc = produce("r.bin")[0]
        if rc != 0:  # the refusal of the first, if it was refused
            rc = produce("r.bin")[0]
        say("produced %%d" %% rc)
        fin = finalize()
        say(json.dumps(fin[0]))
    """ % (size, size // 2, size - size // 2))
    p.expect("ready")
    stop(prod)
    p.send("go")
    p.expect("queued 0", timeout=20)
    time.sleep(0.3)  # its publish is sent meanwhile (and waits for the stopped service)
    p.send("rewrite")
    time.sleep(0.3)
    cont(prod)
    p.expect("half")
    # Half of the new version is on disk, open for writing: a consumer
    # started now gets the whole first version or the whole second.
    c = cons.dyad_async("consume", cons.path("r.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 60})
    time.sleep(0.5)
    p.send("finish")
    p.expect("produced 0")
    assert p.line() == "0"
    assert p.wait() == 0
    out, errs = c.communicate(timeout=90)
    assert c.returncode == 0, errs
    with open(cons.path("r.bin"), "rb") as f:
        got = f.read()
    assert got in (b"A" * size, b"B" * size), (len(got), got[:1], got[-1:])


def test_file_open_again_when_its_turn_comes_waits_for_its_close(nodes):
    prod, cons = nodes[1], nodes[2]
    p = capi(prod, """
        say("ready"); wait("go")
        write("first", b"1")
        write("b.bin", b"old")
        say(json.dumps([produce("first")[0], produce("b.bin")[0]]))
        f = open(os.path.join(D, "b.bin"), "ab")  # open again before its publish is sent
        f.write(b"-more")
        f.flush()
        say("open"); wait("close")
        f.close()
        say(json.dumps(produce("b.bin")))
        say(json.dumps(finalize()))
    """)
    p.expect("ready")
    stop(prod)
    p.send("go")
    assert json.loads(p.line(timeout=20)) == [0, 0]
    p.expect("open")
    cont(prod)
    # first is published; b.bin, open for writing, waits for its close.
    harness.wait_for(lambda: record(cons, "first"), 30, what="first's record")
    time.sleep(0.3)
    assert record(cons, "b.bin") is None
    p.send("close")
    assert json.loads(p.line()) == [0, ""]  # no refusal of the earlier publish
    assert json.loads(p.line()) == [0, ""]
    assert p.wait() == 0
    consume_same(cons, prod, ["b.bin"])
    with open(cons.path("b.bin"), "rb") as f:
        assert f.read() == b"old-more"


def test_failed_publish_is_returned_by_the_next_call_and_by_finalize(nodes):
    prod, cons = nodes[1], nodes[2]
    p = capi(prod, """
        say("ready"); wait("go")
        write("gone.bin", b"x" * 100)
        write("after.bin", b"y" * 100)
        say(json.dumps([produce("gone.bin")[0], produce("after.bin")[0]]))
        wait("next")
        write("next.bin", b"z" * 10)
        say(json.dumps(produce("next.bin")))  # the failure of gone.bin
        say(json.dumps(produce("next.bin")))  # then itself
        wait("last")
        write("last.bin", b"w" * 10)
        say(json.dumps(produce("last.bin")))
        say(json.dumps(finalize()))
    """)
    p.expect("ready")
    stop(prod)
    p.send("go")
    assert json.loads(p.line(timeout=20)) == [0, 0]
    os.unlink(prod.path("gone.bin"))  # removed before its publish reaches the service
    cont(prod)
    # In order: once after.bin is published, gone.bin's publish has failed.
    harness.wait_for(lambda: record(cons, "after.bin"), 30, what="after.bin's record")
    p.send("next")
    rc, msg = json.loads(p.line())
    assert rc < 0 and "gone.bin" in msg and "not carried out" in msg, (rc, msg)
    assert json.loads(p.line()) == [0, ""]
    harness.wait_for(lambda: record(cons, "next.bin"), 30, what="next.bin's record")
    prod.kill()  # the node's service (and its connection) gone
    p.send("last")
    assert json.loads(p.line())[0] == 0  # queued
    rc, msg = json.loads(p.line(timeout=90))
    assert rc < 0 and "last.bin" in msg, (rc, msg)
    assert p.wait() == 0
    assert "gone.bin" in p.stderr() and "last.bin" in p.stderr()  # each logged
    assert record(cons, "gone.bin") is None


def test_exit_drains_the_queue(nodes):
    prod, cons = nodes[1], nodes[2]
    p = capi(prod, """
        say("ready"); wait("go")
        for i in range(10):
            write(f"x/e{i}", data(i, 5000 + i))
            assert produce(f"x/e{i}")[0] == 0
        say("queued")
        sys.exit(0)  # no dyad_finalize: the exit handler drains
    """)
    p.expect("ready")
    stop(prod)
    p.send("go")
    p.expect("queued", timeout=20)
    time.sleep(0.5)
    assert p.p.poll() is None  # exiting, waiting for the service
    cont(prod)
    assert p.wait() == 0
    # Published before the process ended.
    for i in range(10):
        assert record(cons, f"x/e{i}") is not None, i
    consume_same(cons, prod, [f"x/e{i}" for i in range(10)])


def test_exit_says_what_was_not_published_by_the_deadline(nodes):
    prod = nodes[1]
    p = capi(prod, """
        say("ready"); wait("go")
        for i in range(3):
            write(f"t{i}", b"t")
            assert produce(f"t{i}")[0] == 0
        say("queued")
    """, DYAD_ASYNC_PUBLISH_TIMEOUT=1)
    p.expect("ready")
    stop(prod)
    p.send("go")
    p.expect("queued", timeout=20)
    assert p.wait(timeout=30) == 0
    cont(prod)
    err = p.stderr()
    assert "not done within 1 s" in err and "t2'" in err, err


def test_fork_drains_and_the_child_starts_empty(nodes):
    prod, cons = nodes[1], nodes[2]
    p = capi(prod, """
        say("ready"); wait("go")
        for i in range(5):
            write(f"k/f{i}", data(i, 10000))
            assert produce(f"k/f{i}")[0] == 0
        say("queued")
        pid = os.fork()  # waits until the queue is drained
        if pid == 0:
            write("k/child", data(9, 777))
            rc = produce("k/child")[0]
            fin = finalize()
            os._exit(0 if rc == 0 and fin[0] == 0 else 1)
        say("forked")
        wait("check")
        _, st = os.waitpid(pid, 0)
        say(json.dumps([st, finalize()[0]]))
    """)
    p.expect("ready")
    stop(prod)
    p.send("go")
    p.expect("queued", timeout=20)
    time.sleep(0.3)
    cont(prod)
    p.expect("forked")
    for i in range(5):  # published before fork() returned
        assert record(cons, f"k/f{i}") is not None, i
    p.send("check")
    assert json.loads(p.line()) == [0, 0]
    assert p.wait() == 0
    consume_same(cons, prod, [f"k/f{i}" for i in range(5)] + ["k/child"])


def test_full_queue_blocks_rather_than_drops(nodes):
    prod, cons = nodes[1], nodes[2]
    p = capi(prod, """
        say("ready"); wait("go")
        for i in range(10):
            write(f"q/f{i}", data(i, 3000))
            say("queued %d %d" % (i, produce(f"q/f{i}")[0]))
        say(json.dumps(finalize()))
    """, DYAD_ASYNC_PUBLISH_MAX_FILES=2)
    p.expect("ready")
    stop(prod)
    p.send("go")
    got = [p.line(timeout=20)]
    # At most 2 files queued and 2 taken by the publishing thread: the
    # fifth call waits while the service is stopped.
    deadline = time.time() + 1.5
    while time.time() < deadline:
        try:
            got.append(p.lines.get(timeout=max(0.01, deadline - time.time())))
        except queue.Empty:
            pass
    assert 1 <= len(got) <= 4, got
    assert all(g.endswith(" 0") for g in got), got
    cont(prod)
    for i in range(len(got), 10):
        assert p.line() == f"queued {i} 0"
    assert json.loads(p.line()) == [0, ""]
    assert p.wait() == 0
    consume_same(cons, prod, [f"q/f{i}" for i in range(10)])


def test_killed_producer_leaves_no_record_of_what_it_never_published(nodes):
    prod, cons = nodes[1], nodes[2]
    p = capi(prod, """
        say("ready"); wait("go")
        for i in range(5):
            write(f"d/f{i}", data(i, 20000))
            assert produce(f"d/f{i}")[0] == 0
        f = open(os.path.join(D, "d/half"), "wb")
        f.write(b"h" * 5000); f.flush()
        say("writing")
        time.sleep(600)
    """)
    p.expect("ready")
    stop(prod)
    p.send("go")
    p.expect("writing", timeout=20)
    p.p.kill()
    p.p.wait()
    cont(prod)
    # A publish of this node after the kill: the service has read what the
    # killed process had sent by then.
    harness.write_file(prod.path("d/marker"), 10)
    prod.dyad("produce", prod.path("d/marker"))
    assert record(cons, "d/half") is None
    # Only the first file's publish could have been sent before the kill;
    # the others were only queued, and are lost with the process.
    for i in range(1, 5):
        assert record(cons, f"d/f{i}") is None, i
    r = record(cons, "d/f0")
    if r is not None:
        consume_same(cons, prod, ["d/f0"])


def test_wrapper_close_returns_queued_and_exit_drains(nodes):
    prod, cons = nodes[1], nodes[2]
    code = r"""
import os, sys
D = os.environ["DYAD_PATH_PRODUCER"]
def write(rel, b):
    with open(os.path.join(D, rel), "wb") as f:
        f.write(b)
write("w-warm", b"warm")  # its publish makes the connection
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
for i in range(8):
    write(f"w{i}", bytes([i]) * (1000 * i + 1))
print("written", flush=True)
"""
    env = prod.env(DYAD_ASYNC_PUBLISH=1, **harness.preload_env(WRAPPER))
    p = Proc([PY, "-c", code], env)
    p.expect("ready")
    harness.wait_for(lambda: record(cons, "w-warm"), 30, what="w-warm's record")
    stop(prod)
    p.send("go")
    p.expect("written", timeout=20)  # every close returned with the service stopped
    time.sleep(0.3)
    cont(prod)
    assert p.wait() == 0, p.stderr()
    for i in range(8):  # published before the process ended
        assert record(cons, f"w{i}") is not None, i
    consume_same(cons, prod, [f"w{i}" for i in range(8)])
