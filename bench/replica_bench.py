#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Replicas (issue 35): what k=1 costs the producer, how long until a file is
replicated, and how long a consumer takes to fail over.

Rows (each a ratio to the k=0 reference measured side by side, interleaved
rounds; medians, p90 and max over the rounds):
  produce N x 64 KiB, k=1 async / k=0      producer wall time of one `dyad produce`
  produce 1 GiB, k=1 async / k=0           the same for one large file
  publish-to-replicated, N x 64 KiB        from the produce's start until every
                                           replica entry is in the store (seconds)
  produce 1 GiB, k=1 sync                  seconds (the copy itself)
  failover after SIGKILL                   seconds for one consume of a 64 KiB file
                                           whose owner was just killed, and the
                                           same consume from a live owner

Usage: DYAD_BUILD_DIR=build python3 bench/replica_bench.py [--rounds 5] [--files 1000]
Runs 3 nodes as network namespaces when possible (else loopback)."""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402


def stats(xs):
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return statistics.median(xs), p90, xs[-1]


def entries(node):
    out = node.dyad("--json", "ls", env_extra={"DYAD_KVS_NAMESPACE": "dyad.replicas"}).stdout
    s = out.strip()
    if not s:
        return 0
    return len(json.loads(s)) if s.startswith("[") else len([l for l in s.splitlines() if l.strip()])


def produce(node, paths, env):
    t0 = time.monotonic()
    node.dyad("produce", *paths, env_extra=env)
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--big", type=int, default=1 << 30)
    a = ap.parse_args()
    c = harness.Cluster(nodes=3, netns=True)
    try:
        owner, other = c[1], c[2]
        small = {0: [], 1: []}
        big = {0: [], 1: []}
        replicated = []
        seq = 0
        for r in range(a.rounds):
            for k in (0, 1) if r % 2 == 0 else (1, 0):
                seq += 1
                d = owner.path(f"b{seq}")
                paths = [os.path.join(d, f"f{j:05d}") for j in range(a.files)]
                for j, p in enumerate(paths):
                    harness.write_file(p, 64 << 10, seed=j)
                before = entries(other) if k else 0
                t0 = time.monotonic()
                small[k].append(produce(owner, paths, {"DYAD_REPLICAS": k}))
                if k:
                    harness.wait_for(lambda: entries(other) >= before + a.files, 600, interval=0.05,
                                     what="every replica entry")
                    replicated.append(time.monotonic() - t0)
        for k in (0, 1, 0, 1) if a.rounds > 1 else (0, 1):
            seq += 1
            p = owner.path(f"big{seq}.bin")
            harness.write_file(p, a.big, seed=seq)
            big[k].append(produce(owner, [p], {"DYAD_REPLICAS": k}))
        seq += 1
        p = owner.path(f"big{seq}.bin")
        harness.write_file(p, a.big, seed=seq)
        sync_big = produce(owner, [p], {"DYAD_REPLICAS": 1, "DYAD_REPLICAS_SYNC": 1})
        # Failover: one 64 KiB file, from a live owner, then after its SIGKILL.
        live, failover = [], []
        for i in range(3):
            rel = f"fo/live{i}"
            harness.write_file(owner.path(rel), 64 << 10, seed=i)
            produce(owner, [owner.path(rel)], {"DYAD_REPLICAS": 1, "DYAD_REPLICAS_SYNC": 1})
            t0 = time.monotonic()
            other.dyad("consume", other.path(rel))
            live.append(time.monotonic() - t0)
        rels = [f"fo/dead{i}" for i in range(3)]
        for i, rel in enumerate(rels):
            harness.write_file(owner.path(rel), 64 << 10, seed=100 + i)
        produce(owner, [owner.path(x) for x in rels], {"DYAD_REPLICAS": 1, "DYAD_REPLICAS_SYNC": 1})
        owner.kill()
        for rel in rels:
            t0 = time.monotonic()
            other.dyad("consume", other.path(rel), env_extra={"DYAD_WAIT_TIMEOUT": 60})
            failover.append(time.monotonic() - t0)
    finally:
        c.cleanup()
    ratio_small = [x1 / x0 for x0, x1 in zip(small[0], small[1])]
    ratio_big = [x1 / x0 for x0, x1 in zip(big[0], big[1])]
    print(f"# replica_bench: {a.rounds} rounds, {a.files} x 64 KiB, {a.big >> 20} MiB; mode {c.mode}; "
          "machine shared with other builds")
    print("row | p50 | p90 | max")
    print("produce %d x 64 KiB k=0 (s) | %.3f | %.3f | %.3f" % ((a.files,) + stats(small[0])))
    print("produce %d x 64 KiB k=1 async (s) | %.3f | %.3f | %.3f" % ((a.files,) + stats(small[1])))
    print("  ratio k=1 / k=0 (goal <= 1.11, i.e. throughput >= 0.9x) | %.3f | %.3f | %.3f" % stats(ratio_small))
    print("produce 1 file k=0 (s) | %.3f | %.3f | %.3f" % stats(big[0]))
    print("produce 1 file k=1 async (s) | %.3f | %.3f | %.3f" % stats(big[1]))
    print("  ratio k=1 / k=0 | %.3f | %.3f | %.3f" % stats(ratio_big))
    print("publish-to-replicated, %d x 64 KiB (s, whole batch) | %.3f | %.3f | %.3f" % ((a.files,) + stats(replicated)))
    print("produce 1 file k=1 sync (s: the copy) | %.3f | - | -" % sync_big)
    print("consume 64 KiB, owner live (s) | %.3f | %.3f | %.3f" % stats(live))
    print("consume 64 KiB, owner SIGKILLed: failover (s) | %.3f | %.3f | %.3f" % stats(failover))


if __name__ == "__main__":
    main()
