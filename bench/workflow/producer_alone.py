#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The MD producer alone (issue 48): md_pair.py's producer writing N frames
with no consumer running, into node-local disk ("local") and into DYAD's
producer directory under the wrapper, synchronous and with
DYAD_ASYNC_PUBLISH=1, in interleaved rounds on one namespace node of
workflow.Env (no GlusterFS). It separates what publishing costs the
producer from what a consumer's transfer running at the same time costs it:
on one 2-core machine every "node" shares the same cores, so in the MD
table the consumer's receive and its dyadd's send take CPU from the
producer, which a real cluster does not.

    /usr/bin/python3 bench/workflow/producer_alone.py [--size MiB] [--frames N] [--rounds R] [--sim S]

Prints per method the median, min and max production seconds (the sum of
the frames' write-to-published times) and local ÷ method."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workflow as wf  # noqa: E402

METHODS = ["local", "dyad-wrapper", "dyad-wrapper-async"]


def produce(env, node, method, run, size, frames, sim):
    if method == "local":
        d, e = env.local[node.name], env.plain_env()
    else:
        d, e = node.dir, env.dyad_env(node, preload=True)
        if method.endswith("-async"):
            e["DYAD_ASYNC_PUBLISH"] = "1"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(node.prefix + [wf.PY, wf.MD, "produce", "plain", os.path.join(d, run), "--pair", "0",
                                      "--frames", str(frames), "--size", str(size), "--sim", str(sim),
                                      "--out", out.name], env=e, check=True)
        with open(out.name) as f:
            pj = json.load(f)
    return sum(fr["t_published"] - fr["t_write"] for fr in pj["frames"])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=float, default=2.46, help="frame size in MiB")
    p.add_argument("--frames", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sim", type=float, default=0.0)
    a = p.parse_args()
    reason = wf.harness.netns_unavailable_reason()
    if reason:
        sys.exit(f"producer_alone: cannot run here: {reason}")
    size = int(a.size * (1 << 20))
    got = {m: [] for m in METHODS}
    with wf.Env(1, gfs=False) as env:
        node = env.nodes[0]
        for r in range(a.rounds + 1):  # round 0 warms up
            for m in METHODS[r % 3:] + METHODS[:r % 3]:
                t = produce(env, node, m, f"r{r}-{m}", size, a.frames if r else 8, a.sim)
                if r:
                    got[m].append(t)
    local = statistics.median(got["local"])
    print(f"MD producer alone: {a.frames} frames of {a.size} MiB, {a.rounds} interleaved rounds, sim {a.sim} s")
    print(f"{'method':20} {'median s':>9} {'min':>7} {'max':>7} {'local / method':>15}")
    for m, v in got.items():
        print(f"{m:20} {statistics.median(v):9.3f} {min(v):7.3f} {max(v):7.3f} {local / statistics.median(v):14.2f}x")


if __name__ == "__main__":
    main()
