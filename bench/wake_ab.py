#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Publish-to-wake and lookup on etcd, two dyadd builds side by side
(issue 48 item 4): one etcd, a 2-node cluster of each build on it, and
etcd's own put-to-watch (each put after 10 ms idle, as the wake row runs)
and serializable get (bench/etcd_raw.cpp), in interleaved rounds (the
builds' order alternating), so that a machine shared with other work
loads all three alike. Rows as bench/store_bench.py measures them
(bench/store_wake.c through the C API; 10 ms idle before each publish).

  DYAD_BEFORE_DYADD=OTHER_BUILD/bin/dyadd DYAD_BUILD_DIR=build \\
      python3 bench/wake_ab.py

Results: $DYAD_BENCH_OUT/wake_ab.json (default build/bench). Knobs:
WAKE_AB_N (waits and lookups per round and build, 100), WAKE_AB_ROUNDS (10)."""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from store_bench import ask, pct, proc as tool  # noqa: E402  (the wake tool's driver, one copy)

BIN = os.path.join(harness.BUILD, "bin")
RAW = os.path.join(BIN, "bench_etcd_raw")
OUT = os.environ.get("DYAD_BENCH_OUT", os.path.join(harness.BUILD, "bench"))
N = int(os.environ.get("WAKE_AB_N", "100"))
ROUNDS = int(os.environ.get("WAKE_AB_ROUNDS", "10"))


def wakes_and_lookups(c, tag):
    """N waits on node 1 for files node 0 publishes, then N lookups of them."""
    os.makedirs(c[0].path(tag), exist_ok=True)
    pp, cp, lp = tool(c[0], "produce", True), tool(c[1], "consume", False), tool(c[1], "lookup", False)
    wake, look = [], []
    for i in range(N):
        ask(cp, f"{tag}/w{i}")
        assert cp.stdout.readline().strip() == "ready"
        time.sleep(0.01)  # the wait reaches etcd (its watch) first
        ask(pp, f"{tag}/w{i}")
        called, _ = pp.stdout.readline().split()
        wake.append(float(cp.stdout.readline()) - float(called))
    for i in range(N):
        ask(lp, f"{tag}/w{i}")
        t0, t1, rc = lp.stdout.readline().split()
        assert rc == "0", f"lookup of {tag}/w{i}: rc {rc}"
        look.append(float(t1) - float(t0))
    for p in (pp, cp, lp):
        p.stdin.close()
        p.wait()
    return wake, look


def raw(etcd, *args):
    out = subprocess.run([RAW, etcd.endpoint, *args], capture_output=True, text=True, check=True).stdout
    return [float(x) for x in out.split()]


def main():
    before = os.environ.get("DYAD_BEFORE_DYADD")
    if not before or not os.access(before, os.X_OK):
        sys.exit("wake_ab: set DYAD_BEFORE_DYADD to the dyadd to compare with (another build's bin/dyadd)")
    os.makedirs(OUT, exist_ok=True)
    etcd = harness.Etcd()
    after = harness.DYADD
    builds = {}
    try:
        for name, dyadd in (("before", before), ("after", after)):
            harness.DYADD = dyadd  # what the cluster's nodes start
            builds[name] = harness.Cluster(nodes=2, kvs=etcd.uri)
        harness.DYADD = after
        rows = ("before_wake", "after_wake", "before_lookup", "after_lookup", "etcd_watch_idle", "etcd_get")
        acc = {k: [] for k in rows}
        ratios = {"before": [], "after": []}
        for r in range(ROUNDS):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            p50 = {}
            for name in order:
                w, lk = wakes_and_lookups(builds[name], f"{name}{r}")  # distinct keys: one etcd
                acc[name + "_wake"] += w
                acc[name + "_lookup"] += lk
                p50[name] = pct(w, 50)
            w = raw(etcd, "put-to-watch", str(N), "0.01")
            acc["etcd_watch_idle"] += w
            acc["etcd_get"] += raw(etcd, "get", str(N))
            for name in ratios:
                ratios[name].append(p50[name] / pct(w, 50))
            print(f"round {r}: wake p50 / etcd put-to-watch p50: before {ratios['before'][-1]:.2f}x, "
                  f"after {ratios['after'][-1]:.2f}x", flush=True)
    finally:
        for c in builds.values():
            c.cleanup()
        etcd.cleanup()
    res = {"n": N, "rounds": ROUNDS,
           "rows": {k: {"p50_ms": pct(v, 50) * 1e3, "p90_ms": pct(v, 90) * 1e3, "p99_ms": pct(v, 99) * 1e3}
                    for k, v in acc.items()},
           "median_round_wake_ratio": {k: statistics.median(v) for k, v in ratios.items()}}
    for k, v in res["rows"].items():
        print(f"{k:18} p50 {v['p50_ms']:7.3f}  p90 {v['p90_ms']:7.3f}  p99 {v['p99_ms']:7.3f} ms")
    g = res["rows"]["etcd_get"]["p99_ms"]
    for name in ("before", "after"):
        print(f"{name}: wake {res['median_round_wake_ratio'][name]:.2f}x etcd's put-to-watch (median of rounds' p50 "
              f"ratios), lookup p99 {res['rows'][name + '_lookup']['p99_ms'] / g:.2f}x etcd's serializable get p99")
    with open(os.path.join(OUT, "wake_ab.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
