#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fairness row of `make bench`: four fast FLUX_RPC consumers of 128 MiB files
alone, then beside one consumer reading at 1 MB/s, alternating, with the
ratio beside / alone (best round of each). Run on the default budget and on
the smallest one (16M), where the slow consumer's share binds. The goal is a
ratio near 1: a slow consumer holds its own pipeline and nothing more."""
import os
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402
from rawwire import Stream  # noqa: E402
import transport_runs  # noqa: E402
from transport_runs import QUICK, REPS  # noqa: E402

FAST_SIZE = (32 << 20) if QUICK else (128 << 20)


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


def run(memory):
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.start([] if memory is None else ["--memory", memory])
        with open(node.path("slow.bin"), "wb") as fh:
            fh.truncate(1 << 30)
        names = [f"fast{i}.bin" for i in range(8)]
        for n in names:
            with open(node.path(n), "wb") as fh:
                fh.truncate(FAST_SIZE)
        node.dyad("produce", node.path("slow.bin"), *[node.path(n) for n in names])
        alone, beside = [], []
        for _ in range(REPS + 1):  # the first round warms up
            alone.append(fast_round(node, names[:4]))
            slow = Stream(node, "slow.bin")
            st = threading.Thread(target=slow.run, kwargs={"rate": 1e6})
            st.start()
            harness.wait_for(lambda: slow.bytes > 0 or not st.is_alive(), 30, "the slow consumer's first bytes")
            beside.append(fast_round(node, names[4:]))
            slow.s.shutdown(socket.SHUT_RDWR)
            st.join()
        alone, beside = alone[1:], beside[1:]
        mem = node.status()["memory"]
        return {"alone_GBps": alone, "beside_slow_GBps": beside, "ratio": max(beside) / max(alone),
                "memory": {k: mem[k] for k in ("limit", "peak", "parked_total")}}
    finally:
        c.cleanup()


def main():
    results = {}
    print(f"\nFairness: 4 consumers of {FAST_SIZE >> 20} MiB alone and beside one at 1 MB/s, best of {REPS}")
    for label, memory in (("default", None), ("16M", "16M")):
        r = results[label] = run(memory)
        print(f"  budget {label:8} alone {max(r['alone_GBps']):5.2f} GB/s, beside a slow one "
              f"{max(r['beside_slow_GBps']):5.2f} GB/s, ratio {r['ratio']:.2f} "
              f"(parked {r['memory']['parked_total']})")
    transport_runs.save("fairness", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
