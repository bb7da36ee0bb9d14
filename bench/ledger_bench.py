#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the publish ledger's durable copy costs (docs/design.md, "The
embedded store across restarts"), side by side in one run: two store hosts,
one dyadd each, the same binary, one with its ledger in SQLite (the
default) and one with --no-publish-ledger (the reference: the ledger in
memory only, as before).

Rows:
- publish latency: one dyad_produce per file through the C API
  (bench/store_wake.c, a 64-byte file each), LEDGER_N per round, LEDGER_ROUNDS
  interleaved rounds (the order swapped each round, one warm-up round
  untimed); p50/p90/max of every publish of every round, and the ratio of
  the medians (goal: <= 1.25).
- restart: each host holds LEDGER_RESTART_FILES records of its own; the
  time from starting dyadd to its first answer (the harness's start: it
  waits for `dyad service status`), LEDGER_RESTARTS interleaved restarts; and
  how many records `dyad ls` lists after it (the reference lists none).

Results: $DYAD_BENCH_OUT/ledger.json (default build/bench)."""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402

WAKE = os.path.join(harness.BUILD, "bin", "bench_store_wake")
OUT = os.environ.get("DYAD_BENCH_OUT", os.path.join(harness.BUILD, "bench"))
N = int(os.environ.get("LEDGER_N", "500"))
ROUNDS = int(os.environ.get("LEDGER_ROUNDS", "7"))
RESTART_FILES = int(os.environ.get("LEDGER_RESTART_FILES", "10000"))
RESTARTS = int(os.environ.get("LEDGER_RESTARTS", "5"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def publishes(node, tag):
    """N produces through the C API: the latency of each, in seconds."""
    os.makedirs(node.path(tag), exist_ok=True)
    p = subprocess.Popen(node.prefix + [WAKE, "produce", node.dir], env=node.env(), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate("".join(f"{tag}/p{i}\n" for i in range(N)), timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"bench_store_wake produce on {node.name} failed ({p.returncode})")
    return [float(b) - float(a) for a, b in (line.split() for line in out.splitlines())]


def summary(xs, scale=1e6):
    return {"p50": pct(xs, 50) * scale, "p90": pct(xs, 90) * scale, "max": max(xs) * scale, "n": len(xs)}


def main():
    os.makedirs(OUT, exist_ok=True)
    hosts = {"ledger": harness.Cluster(nodes=1),
             "reference": harness.Cluster(nodes=1, dyadd_args=["--no-publish-ledger"])}
    try:
        lat = {k: [] for k in hosts}
        order = list(hosts)
        for r in range(ROUNDS + 1):
            for k in order:
                xs = publishes(hosts[k][0], f"r{r}")
                if r > 0:  # round 0: warm-up
                    lat[k] += xs
            order.reverse()
        pub = {k: summary(v) for k, v in lat.items()}
        pub["ratio_p50"] = pub["ledger"]["p50"] / pub["reference"]["p50"]
        pub["ratio_p90"] = pub["ledger"]["p90"] / pub["reference"]["p90"]

        for k, c in hosts.items():
            node = c[0]
            os.makedirs(node.path("many"), exist_ok=True)
            names = [node.path(f"many/{i:06d}") for i in range(RESTART_FILES)]
            for n in names:
                with open(n, "w") as f:
                    f.write(n)
            for i in range(0, len(names), 1000):
                node.dyad("produce", *names[i:i + 1000])
        took = {k: [] for k in hosts}
        listed = {}
        for r in range(RESTARTS):
            for k in (order if r % 2 == 0 else list(reversed(order))):
                node = hosts[k][0]
                assert node.stop() == 0
                t0 = time.monotonic()
                node.start()
                took[k].append(time.monotonic() - t0)
                listed[k] = len(node.dyad("ls").stdout.splitlines())
        restart = {k: dict(summary(v, 1e3), listed=listed[k]) for k, v in took.items()}
        restart["ratio_p50"] = restart["ledger"]["p50"] / restart["reference"]["p50"]
        result = {"publish_us": pub, "restart_ms": restart, "n": N, "rounds": ROUNDS,
                  "restart_files": RESTART_FILES, "restarts": RESTARTS}
        with open(os.path.join(OUT, "ledger.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(f"publish latency, us (p50 / p90 / max over {ROUNDS} x {N} publishes):")
        for k in hosts:
            s = pub[k]
            print(f"  {k:9s} {s['p50']:8.1f} {s['p90']:8.1f} {s['max']:9.1f}")
        print(f"  ratio ledger/reference: p50 {pub['ratio_p50']:.2f}, p90 {pub['ratio_p90']:.2f}")
        print(f"restart with {RESTART_FILES} own records, ms to the first answer (p50 / p90 / max of {RESTARTS}),"
              " records listed after:")
        for k in hosts:
            s = restart[k]
            print(f"  {k:9s} {s['p50']:8.1f} {s['p90']:8.1f} {s['max']:9.1f}   {s['listed']}")
        print(f"  ratio ledger/reference: p50 {restart['ratio_p50']:.2f}")
        print(f"median of all: {statistics.median(lat['ledger']) * 1e6:.1f} us with, "
              f"{statistics.median(lat['reference']) * 1e6:.1f} us without")
    finally:
        for c in hosts.values():
            c.cleanup()


if __name__ == "__main__":
    main()
