#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fairness row of `make bench`: four fast FLUX_RPC consumers of 128 MiB files
alone, beside one consumer reading at 1 MB/s, and beside one that stopped
reading after its first frame, interleaved round by round, on the default
budget and on the smallest one (--memory 16M), where shares bind. Printed:
the GB/s of each case's median round and p90 round (the slow end), and the ratio of the medians beside /
alone (goal >= 0.8: a slow or stopped consumer holds its own share and
nothing more). The slow and the stopped consumers come from the same process
as the fast ones: the same peer, whose share they would eat first."""
import os
import socket
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402
from rawwire import Stream  # noqa: E402
import transport_runs  # noqa: E402
from transport_runs import QUICK  # noqa: E402

FAST_SIZE = (32 << 20) if QUICK else (128 << 20)
ROUNDS = 1 if QUICK else int(os.environ.get("FAIRNESS_ROUNDS", "5"))
GOAL = 0.8


class Stopped(Stream):
    """A consumer that reads its first frame, then nothing until released."""

    def __init__(self, node, upath):
        super().__init__(node, upath)
        self.first = threading.Event()
        self.release = threading.Event()

    def _frame(self, rate=None):
        r = super()._frame(rate)
        if not self.first.is_set():
            self.first.set()
            self.release.wait(600)
        return r


def fast_round(node, names):
    streams = [Stream(node, n) for n in names]
    threads = [threading.Thread(target=s.run) for s in streams]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    if not all(s.done for s in streams):
        raise RuntimeError(f"a fast consumer failed: {[s.error for s in streams]}")
    return sum(s.bytes for s in streams) / dt / 1e9


def beside(node, names, kind):
    """One fast round beside a slow (1 MB/s) or a stopped consumer."""
    other = (Stream if kind == "slow" else Stopped)(node, f"{kind}.bin")
    t = threading.Thread(target=other.run, kwargs={"rate": 1e6} if kind == "slow" else {}, daemon=True)
    t.start()
    if kind == "slow":
        harness.wait_for(lambda: other.bytes > 0 or not t.is_alive(), 30, "the slow consumer's first bytes")
    else:
        other.first.wait(30)
    try:
        return fast_round(node, names)
    finally:
        other.s.shutdown(socket.SHUT_RDWR)
        if kind != "slow":
            other.release.set()
        t.join(30)


def p90(rates):
    """The GB/s of the p90 round (90th percentile of the round times: the
    slow end, nearest rank)."""
    xs = sorted(rates, reverse=True)
    return xs[min(len(xs) - 1, max(0, -(-9 * len(xs) // 10) - 1))]


def run(memory):
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start([] if memory is None else ["--memory", memory])
        for big in ("slow.bin", "stopped.bin"):
            with open(node.path(big), "wb") as fh:
                fh.truncate(1 << 30)
        names = [f"fast{i}.bin" for i in range(12)]
        for n in names:
            with open(node.path(n), "wb") as fh:
                fh.truncate(FAST_SIZE)
        node.dyad("produce", node.path("slow.bin"), node.path("stopped.bin"), *[node.path(n) for n in names])
        runs = {"alone": [], "beside_slow": [], "beside_stopped": []}
        for i in range(ROUNDS + 1):  # the first round warms up
            cases = [("alone", lambda: fast_round(node, names[:4])),
                     ("beside_slow", lambda: beside(node, names[4:8], "slow")),
                     ("beside_stopped", lambda: beside(node, names[8:], "stopped"))]
            k = i % len(cases)
            for label, fn in cases[k:] + cases[:k]:  # the order rotates from round to round
                r = fn()
                if i:
                    runs[label].append(r)
        med = {k: statistics.median(v) for k, v in runs.items()}
        mem = node.status()["memory"]
        return {"alone_GBps": runs["alone"], "beside_slow_GBps": runs["beside_slow"],
                "beside_stopped_GBps": runs["beside_stopped"], "median_GBps": med,
                "p90_GBps": {k: p90(v) for k, v in runs.items()},
                "ratio_slow": med["beside_slow"] / med["alone"],
                "ratio_stopped": med["beside_stopped"] / med["alone"],
                "memory": {k: mem[k] for k in ("limit", "peak", "parked_total")}}
    finally:
        c.cleanup()


def main():
    results = {}
    print(f"\nFairness: 4 consumers of {FAST_SIZE >> 20} MiB alone, beside one reading at 1 MB/s and beside one "
          f"that stopped; {ROUNDS} interleaved rounds: GB/s of the median round (and of the p90 round, the slow end)")
    for label, memory in (("default", None), ("16M", "16M")):
        r = results[label] = run(memory)
        med, hi = r["median_GBps"], r["p90_GBps"]
        print(f"  budget {label:8} alone {med['alone']:5.2f} (p90 {hi['alone']:4.2f}) GB/s; "
              f"beside slow {med['beside_slow']:5.2f} (p90 {hi['beside_slow']:4.2f}) ratio {r['ratio_slow']:.2f}; "
              f"beside stopped {med['beside_stopped']:5.2f} (p90 {hi['beside_stopped']:4.2f}) "
              f"ratio {r['ratio_stopped']:.2f}; goal >= {GOAL} "
              f"{'met' if min(r['ratio_slow'], r['ratio_stopped']) >= GOAL else 'MISSED'} "
              f"(parked {r['memory']['parked_total']}, peak {r['memory']['peak'] >> 20} MiB)")
    transport_runs.save("fairness", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
