#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The goal table of issue 17: every row with DYAD's figure, its reference's,
the ratio, the goal and whether it was met.

bench/bench.py builds its rows (row() below) into latest.json and prints
them; run alone (the last measuring step of `make bench`), this script
prints them again together with the AUTO rows from auto.json
(bench/auto_bench.py: AUTO against the best fixed mode, goal >= 0.95) and
writes goals.json under build/bench/.

Ratios are DYAD / reference throughput (higher is better, goal ">="), or
DYAD / reference cost for CPU seconds (lower is better, goal "<=").
"""
import json
import os
import sys

import bench_output

AUTO_GOAL = 0.95


def row(workload, ours_name, ours, ref_name, ref, unit, goal=None, lower_is_better=False):
    """One row; goal None: shown for information."""
    ratio = ours / ref if ours is not None and ref else None
    cmp = "<=" if lower_is_better else ">="
    met = None
    if goal is not None and ratio is not None:
        met = ratio <= goal if lower_is_better else ratio >= goal
    return {"workload": workload, "ours_name": ours_name, "ours": ours, "reference_name": ref_name,
            "reference": ref, "unit": unit, "ratio": ratio, "goal": goal, "cmp": cmp, "met": met}


def _num(v, unit):
    if v is None:
        return "-"
    if unit == "GB/s" or v < 10:
        return f"{v:.2f}"
    return f"{v:,.0f}"


def _goal(g):
    text = f"{g:.2f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def print_rows(rows, title, out=print):
    out("")
    out(title)
    out(f"  {'workload':<30} {'ours':<25} {'reference':<30} {'ratio':>6}  {'goal':<7} result")
    for r in rows:
        ours = f"{r['ours_name']} {_num(r['ours'], r['unit'])} {r['unit']}"
        ref = f"{r['reference_name']} {_num(r['reference'], r['unit'])}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        goal = f"{r['cmp']} {_goal(r['goal'])}" if r["goal"] is not None else "(shown)"
        met = {True: "met", False: "MISSED", None: ""}[r["met"]]
        out(f"  {r['workload']:<30} {ours:<25} {ref:<30} {ratio:>6}  {goal:<7} {met}")
    judged = [r for r in rows if r["met"] is not None]
    out(f"  {sum(r['met'] for r in judged)} of {len(judged)} goals met")


def auto_rows(auto):
    """AUTO against the best fixed mode, per placement and file class, from
    auto_bench.py's results."""
    rows = []
    for placement, r in auto.items():
        best = r.get("best_fixed") if isinstance(r, dict) else None
        if not best or "AUTO" not in r:
            continue
        for kind, key, unit, what in (("big", "big_GBps", "GB/s", "large file"),
                                      ("small", "small_files_per_s", "files/s", "64 KiB files")):
            rows.append(row(f"AUTO, {what}, {placement}", "AUTO", r["AUTO"][key], f"best fixed ({best[kind]})",
                            r[best[kind]][key], unit, AUTO_GOAL))
    return rows


def _load(name):
    path = bench_output.results_path(name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main():
    latest, auto = _load("latest"), _load("auto")
    rows = list((latest or {}).get("rows", []))
    if auto:
        rows += auto_rows(auto)
    if not rows:
        print("goals: no rows (run bench/bench.py and bench/auto_bench.py first)", file=sys.stderr)
        return 1
    quick = " (BENCH_QUICK: not a measurement)" if (latest or {}).get("quick") else ""
    print_rows(rows, f"Issue 17 goals: ratio = DYAD / reference{quick}")
    path = bench_output.save("goals", {"rows": rows, "quick": bool((latest or {}).get("quick"))})
    print(f"goals: written to {os.path.relpath(path, os.getcwd())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
