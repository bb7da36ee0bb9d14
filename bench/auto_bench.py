#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""AUTO rows of `make bench`: DYAD_DTL_MODE=AUTO beside every fixed mode this
build has, in the same run, for each workload (a 256 MiB file, 1,000 files of
64 KiB) and placement (the consumer on another node; on the producer's node
with its own directory, where LOCAL applies), with the ratio AUTO / best
fixed mode. Fixed modes that cannot serve a placement (LOCAL on another node)
are left out of it."""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402
import transport_runs  # noqa: E402

from transport_runs import BIG, QUICK, ROOT, ROUNDS, SMALL_N  # noqa: E402,F401
ONLY = [m for m in os.environ.get("BENCH_MODES", "").split(",") if m]


def built_modes():
    names = harness.built_transports() + ["AUTO"]
    return [m for m in names if not ONLY or m in ONLY]


def consumer_node(cluster, placement, tmp_root):
    """The node whose dyad tool consumes: node1, or a second directory on
    node0 (same node, same service, its own consumer directory)."""
    if placement == "other-node":
        return cluster[1]
    n0 = cluster[0]
    view = harness.NodeView(n0, os.path.join(tmp_root, "same-node-consumer"))
    return view


def run_placement(placement, modes):
    res = {}
    with harness.Cluster(nodes=2) as c:
        prod = c[0]
        cons = consumer_node(c, placement, c.root)
        variants = {m: {"DYAD_DTL_MODE": m} for m in modes}
        runs = transport_runs.big_file_rates(prod, cons, BIG, ROUNDS, variants)
        small = {m: [] for m in modes}
        # Rounds interleave the modes, the order rotated each round: per-file
        # cost here is mostly the file system's (openat, rename), which
        # drifts as earlier rounds' data is written back. A warm-up round
        # first, as for the large file and in bench.py: every mode's first
        # round ran 2-3x slower than its later ones (2,500 against 9,000
        # files/s), whatever the mode.
        for r in range(ROUNDS + 1):
            for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                t = transport_runs.small_file_times(prod, cons, SMALL_N, 1, {"DYAD_DTL_MODE": m},
                                                    tag=f"{m}{r}-")
                if r > 0:
                    small[m] += t
        for m in modes:
            res.setdefault(m, {})["big_GBps"] = statistics.median(runs[m])
            res[m]["big_runs_GBps"] = runs[m]
            res[m]["small_files_per_s"] = SMALL_N / statistics.median(small[m])
            res[m]["small_runs_files_per_s"] = [SMALL_N / t for t in small[m]]
        res["cp"] = {"big_GBps": statistics.median(runs["cp"])}
        if "AUTO" in modes:
            res["AUTO"]["chose"] = {k: auto_choice(prod, cons, n, size) for k, n, size in
                                    (("big", "choice-big.bin", BIG), ("small", "choice-small.bin", 65536))}
    return res


def auto_choice(prod, cons, name, size):
    """The transport AUTO takes for a file of this size (untimed)."""
    harness.write_file(prod.path(name), size, seed=5)
    prod.dyad("produce", prod.path(name))
    out = cons.dyad("--json", "consume", cons.path(name), env_extra={"DYAD_DTL_MODE": "AUTO",
                                                                     "DYAD_WAIT_TIMEOUT": 60}).stdout
    return json.loads(out.splitlines()[0])["transport"]


def main():
    modes = built_modes()
    have_auto = "AUTO" in modes
    results = {}
    for placement in ("other-node", "same-node"):
        ms = [m for m in modes if not (placement == "other-node" and m == "LOCAL")]
        results[placement] = run_placement(placement, ms)
    print(f"\nAUTO: {BIG >> 20} MiB file and {SMALL_N} x 64 KiB, median of {ROUNDS} "
          f"(GB/s | files/s); ratio = AUTO / best fixed mode")
    for placement, r in results.items():
        fixed = {m: v for m, v in r.items() if m not in ("AUTO", "cp")}
        print(f"  {placement}:")
        for m, v in r.items():
            if m == "cp":
                continue
            chose = f"  (chose {v['chose']['big']} | {v['chose']['small']})" if "chose" in v else ""
            print(f"    {m:9} {v['big_GBps']:6.2f} GB/s {v['small_files_per_s']:8.0f} files/s{chose}")
        if have_auto and fixed:
            best_big = max(fixed, key=lambda m: fixed[m]["big_GBps"])
            best_small = max(fixed, key=lambda m: fixed[m]["small_files_per_s"])
            r["ratio_big"] = r["AUTO"]["big_GBps"] / fixed[best_big]["big_GBps"]
            r["ratio_small"] = r["AUTO"]["small_files_per_s"] / fixed[best_small]["small_files_per_s"]
            r["best_fixed"] = {"big": best_big, "small": best_small}
            print(f"    ratio AUTO/best: big {r['ratio_big']:.2f} (best {best_big}), "
                  f"small {r['ratio_small']:.2f} (best {best_small}); cp {r['cp']['big_GBps']:.2f} GB/s")
    transport_runs.save("auto", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
