#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two builds of DYAD side by side on the headline rows of bench.py (one
1 GiB file and 2,000 files of 64 KiB, node0 -> node1, one `dyad consume`
each, FLUX_RPC): for a redesign that must not cost speed (docs/design.md,
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
big) runs that row alone. Writes
build_compare.json under build/bench/ (bench_output.py).
"""
import contextlib
import json
import os
import statistics
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
ROWS = [r for r in os.environ.get("BENCH_ROWS", "big,small").split(",") if r in ("big", "small")]


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
    rows = {"big": {k: [] for k in builds}, "small": {k: [] for k in builds}}
    try:
        order = list(builds)
        for i in range(REPS + 1):
            tag = "warmup" if i == 0 else f"r{i}"
            for row, fn in [(r, f) for r, f in (("big", big_round), ("small", small_round)) if r in ROWS]:
                for name in order:
                    with build(builds[name]):
                        v = fn(clusters[name], f"{tag}-{name}")
                    unit = "GB/s" if row == "big" else "files/s"
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
    for row, unit in [(r, u) for r, u in (("big", "GB/s"), ("small", "files/s")) if r in ROWS]:
        n, o = rows[row]["new"], rows[row]["old"]
        summary[row] = {"unit": unit, "new": n, "old": o,
                        "ratio": statistics.median(n) / statistics.median(o)}
        label = f"{BIG >> 20} MiB" if row == "big" else f"{COUNT} x 64 KiB"
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
