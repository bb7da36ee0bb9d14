# SPDX-License-Identifier: Apache-2.0
"""Waiting you can see anywhere (issue 46, item 3): a consumer of a file
nobody produces, with its stderr a pipe (a batch job's), says within a few
seconds what it waits for, through the wrapper, the C API (pydyad) and the
CLI; killed (SIGTERM: a job's time limit), its last line names the file."""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from pydyad_testlib import pyenv  # noqa: E402

WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
PY = "/usr/bin/python3"


@pytest.fixture(scope="module")
def cluster():
    c = harness.Cluster(nodes=2)
    yield c
    c.cleanup()


class Lines:
    """A process's stderr, line by line, as it comes."""

    def __init__(self, proc):
        self.proc = proc
        self.q = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            self.q.put(line.decode(errors="replace").rstrip("\n"))
        self.q.put(None)

    def until(self, predicate, timeout):
        """Lines until one satisfies predicate (that one), or None at the
        deadline or at the end of the output."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            self.seen.append(line)
            if predicate(line):
                return line
        return None

    def rest(self, timeout=30):
        while self.until(lambda _: False, timeout) is not None:
            pass
        return self.seen


def consumers(cons):
    """A consumer of a never-produced file per way of consuming, each
    waiting without a limit."""
    pydyad = ("import sys\nfrom pydyad import Dyad\nd = Dyad()\nd.init_env()\nd.consume(sys.argv[1])\n")
    return {
        "wrapper": (["cat", cons.path("never/by-wrapper.bin")], cons.env(**harness.preload_env(WRAPPER))),
        "pydyad": ([PY, "-c", pydyad, cons.path("never/by-pydyad.bin")], pyenv(cons)),
        "cli": ([harness.DYAD, "consume", cons.path("never/by-cli.bin")], cons.env()),
    }


def test_a_wait_is_reported_on_a_pipe_and_at_the_kill(cluster):
    cons = cluster[1]
    procs = {}
    try:
        for name, (cmd, env) in consumers(cons).items():
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            procs[name] = (p, Lines(p), os.path.basename(cmd[-1]))
        for name, (p, lines, base) in procs.items():
            line = lines.until(lambda l: "still waiting for" in l, 60)
            assert line is not None, (name, p.poll(), lines.seen)
            # the file, the service, how long, what ends the wait
            assert base in line and "service" in line and "s so far" in line, (name, line)
            assert "DYAD_WAIT_TIMEOUT" in line, (name, line)
        for p, _, _ in procs.values():
            p.send_signal(signal.SIGTERM)
        for name, (p, lines, base) in procs.items():
            rc = p.wait(timeout=30)
            seen = [l for l in lines.rest() if l.strip()]
            assert seen and base in seen[-1], (name, seen)
            if name == "cli":  # its own handler, its own line
                assert rc == 128 + signal.SIGTERM and "interrupted while waiting for" in seen[-1], (rc, seen)
            else:  # the library's line, then death by the signal as without it
                assert rc == -signal.SIGTERM, (name, rc, seen)
                assert "SIGTERM" in seen[-1] and "waiting" in seen[-1], (name, seen)
    finally:
        for p, _, _ in procs.values():
            if p.poll() is None:
                p.kill()


def log_lines(node, needle):
    with open(node.log_path, errors="replace") as f:
        return [line.rstrip("\n") for line in f if needle in line]


def test_a_long_wait_is_logged_by_the_service_that_holds_it():
    """The dyadd log says who waits for what, and for how long (issue 46,
    item 3): a consumer's wait held by its service (its store's host) is one
    line after 5 s naming the file, the client's pid and uid, then again at
    10 s. Each request is held at most --max-wait 2 s, so the client asks
    again and again: the lines count the whole wait, not the last request."""
    c = harness.Cluster(nodes=1, dyadd_args=["--max-wait", "2"])
    try:
        node = c[0]
        p = node.dyad_async("consume", node.path("logged/never.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 60})
        try:
            needle = "for 'logged/never.bin'"
            lines = harness.wait_for(lambda: len(log_lines(node, needle)) >= 2 and log_lines(node, needle), 20,
                                     what="two lines of the wait in the dyadd log", interval=0.2)
        finally:
            p.kill()
            p.wait()
        first, second = lines[0], lines[1]
        assert f"pid {p.pid}, uid {os.getuid()}" in first, first
        # Each line is written when the client's next request of the wait
        # comes (every --max-wait 2 s) past a mark of 5, 10, 20 ... s: it
        # says the whole wait so far, the mark or a second or so after it.
        def waited(line):
            m = re.search(r"has waited (\d+) s", line)
            assert m, line
            return int(m.group(1))

        assert 5 <= waited(first) < 10 and "namespace" in first, first
        assert 10 <= waited(second) < 20, second
    finally:
        c.cleanup()
