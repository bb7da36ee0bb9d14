#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What `--dyad` adds to a job's start (issue 46, item 8), on the tests'
Slurm cluster (scripts/slurm_cluster.py: slurmd "nodes" in namespaces on
this machine, PrologFlags=Alloc, the SPANK plugin of the build).

A trivial job, `srun -N2 true`, is run with and without `--dyad`, in
interleaved rounds (one of each per round, the order alternating), each
after every node is idle again (the epilog of the one before is not
counted). Printed: the job's wall time (median, p90, max) for both kinds,
the difference of the medians and their ratio; and the plugin's "dyadd ready
on NODE in X s" of the slurmd logs (its prolog, from `dyad job node-up` to
the dyadd proven ready), per node.

    sudo python3 bench/startup_bench.py [--rounds 15] [--nodes 2] [--json FILE]

The build measured is DYAD_BUILD_DIR's (default: build/). Root, Slurm and
munge are needed, as for tests/slurm."""
import argparse
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402
import slurm_cluster  # noqa: E402

READY = re.compile(r"dyad: job (\d+): dyadd ready on (\S+) in ([0-9.]+) s")


def figures(xs):
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return {"n": len(xs), "median": statistics.median(xs), "p90": p90, "max": xs[-1], "min": xs[0]}


def idle(slurm):
    def check():
        r = slurm.cmd("sinfo", "-h", "-N", "-o", "%t", check=False)
        states = r.stdout.split()
        return states and all(s == "idle" for s in states)

    harness.wait_for(check, 60, what="every node idle", interval=0.02)


def one_job(slurm, nodes, dyad):
    args = ["srun", f"-N{nodes}", f"-n{nodes}"] + (["--dyad"] if dyad else []) + ["true"]
    t0 = time.monotonic()
    r = slurm.cmd(*args, check=False, timeout=120)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr}\n{slurm.tail_logs()}")
    return dt


def ready_times(slurm):
    """{node: [seconds]} of the plugin's "dyadd ready" lines."""
    out = {}
    for n in slurm.names:
        path = os.path.join(slurm.root, "log", f"slurmd-{n}.log")
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    m = READY.search(line)
                    if m:
                        out.setdefault(m.group(2), []).append(float(m.group(3)))
        except OSError:
            pass
    return out


def fmt(f):
    if not f.get("n"):
        return "no runs"
    return f"median {f['median']:.3f} s  p90 {f['p90']:.3f} s  max {f['max']:.3f} s  (n={f['n']})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the job (the cluster has 4)")
    ap.add_argument("--warmup", type=int, default=2, help="rounds run first and not counted")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--plugstack", action="append", default=[],
                    help="an argument of the plugin's plugstack.conf line (e.g. store=embedded); repeatable")
    a = ap.parse_args()
    reason = slurm_cluster.unavailable_reason()
    if reason:
        sys.exit(f"startup_bench: {reason}")
    slurm = slurm_cluster.SlurmCluster(nodes=max(4, a.nodes), plugstack_args=a.plugstack)
    try:
        times = {"plain": [], "dyad": []}
        for i in range(a.warmup + a.rounds):
            order = [False, True] if i % 2 == 0 else [True, False]
            for dyad in order:
                idle(slurm)
                dt = one_job(slurm, a.nodes, dyad)
                if i >= a.warmup:
                    times["dyad" if dyad else "plain"].append(dt)
        idle(slurm)
        ready = ready_times(slurm)
    finally:
        slurm.cleanup()
    plain, dyad = figures(times["plain"]), figures(times["dyad"])
    print(f"build: {harness.BUILD}")
    print(f"`srun -N{a.nodes} true`         {fmt(plain)}")
    print(f"`srun -N{a.nodes} --dyad true`  {fmt(dyad)}")
    diff = dyad["median"] - plain["median"]
    ratio = dyad["median"] / plain["median"]
    print(f"--dyad adds {diff:.3f} s to the median job (ratio {ratio:.2f}); goal: under 0.2 s")
    per_node = {}
    for node in sorted(ready):
        xs = ready[node][a.warmup:] if len(ready[node]) > a.warmup else ready[node]
        per_node[node] = figures(xs)
        print(f"prolog to dyadd ready on {node}: {fmt(per_node[node])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"build": harness.BUILD, "nodes": a.nodes, "rounds": a.rounds, "plain": plain, "dyad": dyad,
                       "difference_s": diff, "ratio": ratio, "ready": per_node, "raw": times}, f, indent=2)


if __name__ == "__main__":
    main()
