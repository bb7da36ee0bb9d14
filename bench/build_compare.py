#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two builds of DYAD side by side on the headline rows of bench.py (one
1 GiB file and 2,000 files of 64 KiB, node0 -> node1, one `dyad consume`
each, FLUX_RPC) and on the publish latency (publish_latency.py's
synchronous row: PL_N dyad_produce calls of a 4 KiB file on node0 over its
Unix socket; the rate is 1 / the calls' median): for a redesign that must not cost speed (docs/design.md,
"Inside the service and the client"). Each build runs its own two-node
cluster with its own dyadd and dyad; rounds interleave the builds and
rotate which goes first; a warm-up round, then BENCH_REPS measured rounds
(default 5); per build the median, the slow tail (p10 of the rates, the
rate of the p90 time) and the minimum, and the ratio of medians. The
rounds are auth_bench.py's (sizes checked, and the bytes of one small
file in a hundred).

  BENCH_OLD_BUILD=DIR (a build tree or a copy of its bin/ and lib/, e.g. of
  the commit before the change) python3 bench/build_compare.py

BENCH_DIR=/dev/shm puts the nodes' directories there; BENCH_ROWS=small (or
big, or publish, or a comma-separated list) runs those rows alone. Writes
build_compare.json under build/bench/ (bench_output.py).
"""
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
import harness  # noqa: E402
import bench_output  # noqa: E402
sys.path.insert(0, HERE)
from auth_bench import BIG, COUNT, big_round, small_round  # noqa: E402  (the same rows)

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
REPS = int(os.environ.get("BENCH_REPS", 1 if QUICK else 5))
BENCH_DIR = os.environ.get("BENCH_DIR") or None
OLD = os.environ.get("BENCH_OLD_BUILD")
RESULTS = bench_output.results_path("build_compare")
UNITS = {"big": "GB/s", "small": "files/s", "publish": "calls/s"}
ROWS = [r for r in os.environ.get("BENCH_ROWS", "big,small,publish").split(",") if r in UNITS]
PL_N = int(os.environ.get("PL_N", "300"))


def publish_round(cluster, tag):
    """Calls per second of a synchronous dyad_produce of a 4 KiB file (the
    median call, the first tenth left out as warm-up), with this build's
    bench_publish_latency."""
    node = cluster[0]
    env = node.env(consumer=False, DYAD_SERVICE_URI=node.unix_uri, DYAD_ASYNC_PUBLISH="0")
    prog = os.path.join(harness.BUILD, "bin", "bench_publish_latency")
    d = os.path.join(node.dir, tag)
    os.makedirs(d, exist_ok=True)
    p = subprocess.run([prog, "produce", d, str(PL_N), "4096"], env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{prog} produce: {p.stderr}")
    calls = [int(line) for line in p.stdout.splitlines() if line.strip().isdigit()]  # not "finalize NS"
    return 1e9 / statistics.median(calls[len(calls) // 10:])


@contextlib.contextmanager
def build(path):
    """The harness's programs are those of the build at `path` meanwhile."""
    saved = (harness.BUILD, harness.DYADD, harness.DYAD)
    harness.BUILD = path
    harness.DYADD = os.path.join(path, "bin", "dyadd")
    harness.DYAD = os.path.join(path, "bin", "dyad")
    try:
        yield
    finally:
        harness.BUILD, harness.DYADD, harness.DYAD = saved


def p10(xs):
    """The slow tail of a rate: its 10th percentile (nearest rank)."""
    s = sorted(xs)
    return s[int(round(0.1 * (len(s) - 1)))]


def main():
    if not OLD:
        sys.exit("give BENCH_OLD_BUILD=DIR: the build to compare this one with")
    builds = {"new": harness.BUILD, "old": os.path.abspath(OLD)}
    clusters = {}
    for name, path in builds.items():
        with build(path):
            root = tempfile.mkdtemp(prefix="dyad-bench-", dir=BENCH_DIR) if BENCH_DIR else None
            clusters[name] = harness.Cluster(nodes=2, root=root)
    rows = {r: {k: [] for k in builds} for r in UNITS}
    rounds = {"big": big_round, "small": small_round, "publish": publish_round}
    try:
        order = list(builds)
        for i in range(REPS + 1):
            tag = "warmup" if i == 0 else f"r{i}"
            for row in ROWS:
                for name in order:
                    with build(builds[name]):
                        v = rounds[row](clusters[name], f"{tag}-{name}")
                    unit = UNITS[row]
                    print(f"  {row:<5} {tag:<6} {name:<4} {v:9.2f} {unit}", flush=True)
                    if i:
                        rows[row][name].append(v)
            order.reverse()
    finally:
        for name, c in clusters.items():
            with build(builds[name]):
                c.cleanup()
    summary = {}
    print("\n| row | new: median / p10 / min | old: median / p10 / min | new / old (medians) |")
    print("|---|---|---|---|")
    for row in ROWS:
        unit = UNITS[row]
        n, o = rows[row]["new"], rows[row]["old"]
        summary[row] = {"unit": unit, "new": n, "old": o,
                        "ratio": statistics.median(n) / statistics.median(o)}
        label = {"big": f"{BIG >> 20} MiB", "small": f"{COUNT} x 64 KiB",
                 "publish": "publish of 4 KiB (sync)"}[row]
        print(f"| {label} | {statistics.median(n):.2f} / {p10(n):.2f} / {min(n):.2f} {unit} | "
              f"{statistics.median(o):.2f} / {p10(o):.2f} / {min(o):.2f} {unit} | "
              f"{summary[row]['ratio']:.3f} |")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"reps": REPS, "bench_dir": BENCH_DIR, "old_build": "given",
                   "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
