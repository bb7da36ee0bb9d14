# SPDX-License-Identifier: Apache-2.0
"""Fair shares of the service's transfer memory (issue 38, item 3): on the
smallest budget (--memory 16M), a consumer that reads slowly and one that
stops reading hold at most their own share; fast consumers beside them, from
the same peer and from another node, finish within their deadline with every
byte right; the stopped one is ended at --send-timeout with a clear error,
and holds nothing after. No timing is asserted beyond the deadlines (which
are generous: the fast transfers take about a second here); throughput beside
a slow consumer is bench/fairness_bench.py's row."""
import hashlib
import json
import socket
import threading
import time

import harness
from rawwire import Stream

SEND_TIMEOUT = 30  # s: the service's --send-timeout: the stopped consumer holds its buffers that long
DEADLINE = 20  # s: each fast consumer's deadline (its transfer takes ~1 s here)
FAST, FAST_SIZE = 4, 64 << 20  # raw consumers from the slow one's peer
FAR, FAR_SIZE = 2, 32 << 20  # `dyad consume` on the other node


class CheckedStream(Stream):
    """A raw FLUX_RPC consumer (rawwire.Stream) that keeps a SHA-256 of the
    file bytes it reads, and can stop reading after its first frame until
    `resume` is set."""

    def __init__(self, node, upath):
        super().__init__(node, upath)
        self.sha = hashlib.sha256()
        self.first_frame = threading.Event()
        self.resume = None

    def _frame(self, rate=None):
        typ, tag, err, meta, dl = self._head()
        left = dl
        while left:
            n = min(left, len(self.buf) if rate is None else 65536)
            view = memoryview(self.buf)[:n]
            self._exact(view)
            self.sha.update(view)
            left -= n
            self.bytes += n
            if rate:
                time.sleep(n / rate)  # not an ordering sleep: reads at `rate` bytes/s (a slow consumer)
        if self.resume is not None and not self.first_frame.is_set():
            self.first_frame.set()
            # A consumer that stops reading: until the test says (after the
            # service gave up on it), not for a time.
            self.resume.wait(120)
        return typ, err


def test_slow_and_stopped_readers_hold_only_their_share_on_a_small_budget():
    c = harness.Cluster(nodes=2, start=False)
    try:
        prod, far = c[0], c[1]
        prod.start(["--memory", "16M", "--send-timeout", str(SEND_TIMEOUT)])
        far.start()
        for name, size in (("slow.bin", 256 << 20), ("stopped.bin", 64 << 20)):
            with open(prod.path(name), "wb") as fh:
                fh.truncate(size)
        fast = [f"fast{i}.bin" for i in range(FAST)]
        remote = [f"far{i}.bin" for i in range(FAR)]
        for i, n in enumerate(fast):
            harness.write_file(prod.path(n), FAST_SIZE, seed=100 + i)
        for i, n in enumerate(remote):
            harness.write_file(prod.path(n), FAR_SIZE, seed=200 + i)
        prod.dyad("produce", prod.path("slow.bin"), prod.path("stopped.bin"),
                  *[prod.path(n) for n in fast + remote])
        want = {n: harness.sha256(prod.path(n)) for n in fast + remote}

        # The slow reader (1 MB/s) and the stopped one, from this process: the
        # same peer as the fast raw consumers below.
        slow = CheckedStream(prod, "slow.bin")
        st = threading.Thread(target=slow.run, kwargs={"rate": 1e6})
        st.start()
        stopped = CheckedStream(prod, "stopped.bin")
        stopped.resume = threading.Event()
        sp = threading.Thread(target=stopped.run)
        sp.start()
        harness.wait_for(lambda: slow.bytes > 0 or not st.is_alive(), 30, "the slow consumer's first bytes")
        assert stopped.first_frame.wait(30), "the stopped consumer got no first frame"

        # Fast consumers: four raw ones of the same peer, two `dyad consume`
        # on the other node, all at once, each with its deadline.
        streams = [CheckedStream(prod, n) for n in fast]
        threads = [threading.Thread(target=s.run) for s in streams]
        env = {"DYAD_DTL_MODE": "FLUX_RPC", "DYAD_WAIT_TIMEOUT": 30, "DYAD_TRANSFER_TIMEOUT": DEADLINE}
        procs = [far.dyad_async("--json", "consume", far.path(n), env_extra=env) for n in remote]
        for t in threads:
            t.start()
        deadline = time.monotonic() + DEADLINE
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        late = [(s.bytes, s.error) for s in streams if not s.done]
        assert not late, f"fast consumers beside a slow and a stopped one missed their {DEADLINE} s deadline: {late}"
        for n, s in zip(fast, streams):
            assert s.bytes == FAST_SIZE and s.sha.hexdigest() == want[n], n
        for n, p in zip(remote, procs):
            out, err = p.communicate(timeout=DEADLINE + 30)
            assert p.returncode == 0, f"consumer of {n} on the other node: {err}"
            assert json.loads(out.splitlines()[-1])["action"] == "fetched", out
            assert harness.sha256(far.path(n)) == want[n], n

        # The stopped one is ended at --send-timeout, said in the service's
        # log and counted; it finds its connection closed, not a whole file.
        status = prod.wait_status(
            lambda s: s["counters"]["per_transport"]["FLUX_RPC"]["transport"]["stalled_consumers"] >= 1,
            "the stopped consumer to be ended", timeout=SEND_TIMEOUT + 60)
        assert status["counters"]["per_transport"]["FLUX_RPC"]["transport"]["stalled_consumers"] == 1
        prod.log.flush()
        with open(prod.log_path, errors="replace") as f:
            text = f.read()
        # (The request's line escapes its message's spaces.)
        said = [ln for ln in text.splitlines() if "path=stopped.bin" in ln and "errno=ETIMEDOUT" in ln]
        assert said and "no\\x20progress" in said[0], text[-2000:]
        stopped.resume.set()
        sp.join(timeout=60)
        assert not sp.is_alive() and not stopped.done, "the stopped consumer was not ended"
        assert stopped.bytes < 64 << 20

        # The slow one still moves, and nobody holds memory once it goes.
        before = slow.bytes
        harness.wait_for(lambda: slow.bytes > before or not st.is_alive(), 30, "the slow consumer to read on")
        assert st.is_alive() and slow.error is None, slow.error
        slow.s.shutdown(socket.SHUT_RDWR)
        st.join(timeout=60)
        mem = prod.wait_status(lambda s: s["memory"]["in_use"] == 0 and s["memory"]["endpoints"] == 0,
                               "every buffer back in the budget")["memory"]
        assert mem["peak"] <= 16 << 20, mem
        assert mem["parked_total"] > 0, f"the 16M budget never bound: the test proves nothing: {mem}"
    finally:
        c.cleanup()


def test_a_slow_reader_stops_reading_ahead_once_backed_up():
    """A consumer reading at 1 MB/s fills its socket, then the chunks queued
    behind it; from then on the service reads its next chunk only when the
    last one is taken (no read-ahead for a consumer that does not keep up),
    so it holds one 1 MiB chunk at most instead of its whole pipeline (4)."""
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start(["--memory", "16M"])
        with open(node.path("slow.bin"), "wb") as fh:
            fh.truncate(256 << 20)
        node.dyad("produce", node.path("slow.bin"))
        slow = CheckedStream(node, "slow.bin")
        st = threading.Thread(target=slow.run, kwargs={"rate": 1e6})
        st.start()
        try:
            harness.wait_for(lambda: slow.bytes > 0 or not st.is_alive(), 30, "the slow consumer's first bytes")
            # What it held while its socket filled drains at 1 MB/s (a few
            # seconds); then at most the one chunk on its way.
            node.wait_status(lambda s: 0 < s["memory"]["in_use"] <= 1 << 20 or not st.is_alive(),
                             "the slow consumer to hold one chunk", timeout=60)
            assert st.is_alive() and slow.error is None, slow.error
        finally:
            slow.s.shutdown(socket.SHUT_RDWR)
            st.join(timeout=60)
    finally:
        c.cleanup()
