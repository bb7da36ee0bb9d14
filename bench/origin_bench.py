#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Read-through (DYAD_PATH_ORIGIN): a second node's reads of origin-backed
samples from the peer that read them through and published them
(DYAD_ORIGIN_PUBLISH=1), against reading them through from the origin
directory itself.

Two dyadd services (scripts/harness.py; node0 on 127.0.0.1 holds the
metadata, node1 on 127.0.0.2). The origin is a plain directory of
BENCH_ORIGIN_FILES samples of BENCH_ORIGIN_SIZE bytes (default 256 x
256 KiB) in the system temp dir (the parallel file system's stand-in; the
GlusterFS baseline comes with the workflow issue). Untimed: node0 reads every
sample through and publishes it (one `dyad consume` of all).

Each round, in alternating order, on node1, into an emptied consumer
directory, one `dyad consume` process listing every sample (pipelined,
DYAD_CONSUME_WINDOW), timed from its start to its exit:
- peer: with DYAD_PATH_ORIGIN set; node0's records win, the bytes come from
  node0 (`"action": "fetched"`, checked);
- origin: the same samples, looked up in a metadata namespace without
  records (DYAD_KVS_NAMESPACE), so each is read through from the origin
  (`"action": "origin"`, checked).

Reports p50/p90/max of each and the ratio origin/peer of the medians (above
1: the peer is faster). The origin here is a local directory in the page
cache: this measures DYAD's read-through path against its peer path on one
machine, not a parallel file system's latency, which is what the peer path
saves in practice. Results: $BENCH_OUT/origin.json.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import bench_output  # noqa: E402

FILES = int(os.environ.get("BENCH_ORIGIN_FILES", 256))
SIZE = int(os.environ.get("BENCH_ORIGIN_SIZE", 256 << 10))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 7))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def consume_all(node, names, want_action, **env):
    t0 = time.monotonic()
    p = node.dyad("--json", "consume", *[node.path(n) for n in names],
                  env_extra={"DYAD_WAIT_TIMEOUT": 60, **env})
    dt = time.monotonic() - t0
    actions = {json.loads(line)["action"] for line in p.stdout.splitlines() if line.strip()}
    if actions != {want_action}:
        raise RuntimeError(f"expected every sample {want_action}, got {actions}")
    return dt


def empty(node, names):
    for n in names:
        try:
            os.unlink(node.path(n))
        except FileNotFoundError:
            pass


def main():
    origin = tempfile.mkdtemp(prefix="dyad-origin-")
    names = [f"train/s{i:05d}.npy" for i in range(FILES)]
    for i, n in enumerate(names):
        harness.write_file(os.path.join(origin, n), SIZE, seed=i)
    c = harness.Cluster(nodes=2)
    try:
        n0, n1 = c[0], c[1]
        consume_all(n0, names, "origin", DYAD_PATH_ORIGIN=origin, DYAD_ORIGIN_PUBLISH=1)
        runs = {"peer": [], "origin": []}
        for r in range(ROUNDS):
            order = ["peer", "origin"] if r % 2 == 0 else ["origin", "peer"]
            for kind in order:
                empty(n1, names)
                if kind == "peer":
                    dt = consume_all(n1, names, "fetched", DYAD_PATH_ORIGIN=origin)
                else:
                    dt = consume_all(n1, names, "origin", DYAD_PATH_ORIGIN=origin,
                                     DYAD_KVS_NAMESPACE="bench-no-records")
                runs[kind].append(dt)
            log(f"round {r + 1}/{ROUNDS}: peer {runs['peer'][-1]:.3f} s, origin {runs['origin'][-1]:.3f} s")
        res = {"files": FILES, "size": SIZE, "rounds": ROUNDS}
        for kind, xs in runs.items():
            res[kind] = {"p50_s": statistics.median(xs), "p90_s": pct(xs, 0.9), "max_s": max(xs),
                         "MB_per_s_p50": FILES * SIZE / statistics.median(xs) / 1e6, "runs_s": xs}
        res["ratio_origin_over_peer_p50"] = res["origin"]["p50_s"] / res["peer"]["p50_s"]
        path = bench_output.save("origin", res)
        print(json.dumps({k: v for k, v in res.items() if k not in ("peer", "origin")} |
                         {k: {kk: vv for kk, vv in res[k].items() if kk != "runs_s"} for k in ("peer", "origin")},
                         indent=2))
        log(f"results: {path}")
    finally:
        c.cleanup()
        shutil.rmtree(origin, ignore_errors=True)


if __name__ == "__main__":
    main()
