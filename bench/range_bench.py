#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Byte-range row of `make bench` (issue 37): 1 MiB out of a 1 GiB file of
another node with dyad_consume_range (pydyad's Dyad.consume_range), against
the whole-file consume of the same file (goal: the range >= 20x faster), and
once the file is on the consumer's node, the range again (a local pread
inside DYAD, after its metadata lookup) against a plain os.pread of the same
bytes (goal: within 2x), and beside it the metadata lookup alone (what the
cached range adds to the pread: the generation check). All are timed in one
consumer process, in interleaved rounds; medians, p90 and max per call."""
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import bench_output  # noqa: E402
import harness  # noqa: E402

GIB, MIB = 1 << 30, 1 << 20
ROUNDS = int(os.environ.get("BENCH_RANGE_ROUNDS", "7"))
CALLS = int(os.environ.get("BENCH_RANGE_CALLS", "5"))  # range calls per round and kind

# Runs on the consumer's node: prints one JSON object of per-call seconds.
CONSUMER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import pydyad
path, rounds, calls = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
off, n = (1 << 30) // 2, 1 << 20
d = pydyad.Dyad()
d.init_env()
t = {"remote_range": [], "whole_consume": [], "cached_range": [], "pread": [], "lookup": []}
def clock(f):
    t0 = time.perf_counter(); r = f(); return time.perf_counter() - t0, r
for r in range(rounds + 1):  # round 0 warms up, untimed
    if os.path.exists(path):
        os.unlink(path)
    remote = [clock(lambda: d.consume_range(path, off, n)) for _ in range(calls)]
    assert not os.path.exists(path) and all(len(b) == n for _, b in remote)
    whole, _ = clock(lambda: d.consume(path))
    cached = [clock(lambda: d.consume_range(path, off, n)) for _ in range(calls)]
    fd = os.open(path, os.O_RDONLY)
    plain = [clock(lambda: os.pread(fd, n, off)) for _ in range(calls)]
    os.close(fd)
    look = [clock(lambda: d.get_metadata(path)) for _ in range(calls)]
    assert all(b == plain[0][1] for _, b in remote + cached)
    if r:
        t["remote_range"] += [s for s, _ in remote]
        t["whole_consume"].append(whole)
        t["cached_range"] += [s for s, _ in cached]
        t["pread"] += [s for s, _ in plain]
        t["lookup"] += [s for s, _ in look]
print(json.dumps(t))
"""


def stats(xs):
    xs = sorted(xs)
    return {"p50": statistics.median(xs), "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))], "max": xs[-1],
            "n": len(xs)}


def main():
    with harness.Cluster(nodes=2) as c:
        prod, cons = c[0], c[1]
        harness.write_file(prod.path("range/big.bin"), GIB, seed=9)
        prod.dyad("produce", prod.path("range/big.bin"))
        os.makedirs(cons.path("range"), exist_ok=True)
        p = subprocess.run(cons.prefix + [sys.executable, "-c", CONSUMER, os.path.join(harness.ROOT, "python"),
                                          cons.path("range/big.bin"), str(ROUNDS), str(CALLS)],
                           env=cons.env(DYAD_WAIT_TIMEOUT=60,
                                        DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so.0")),
                           capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        t = json.loads(p.stdout)
    res = {k: stats(v) for k, v in t.items()}
    res["whole_over_remote_range"] = res["whole_consume"]["p50"] / res["remote_range"]["p50"]
    res["cached_range_over_pread"] = res["cached_range"]["p50"] / res["pread"]["p50"]
    # What the cached range does beyond the pread: one metadata lookup (the
    # generation check), timed alone as a second reference.
    res["cached_range_over_pread_plus_lookup"] = res["cached_range"]["p50"] / (
        res["pread"]["p50"] + res["lookup"]["p50"])
    res["goals"] = {"whole_over_remote_range_min": 20, "cached_range_over_pread_max": 2}
    res["runs_s"] = t
    print(f"\nByte range: 1 MiB of a 1 GiB file, {ROUNDS} rounds x {CALLS} calls (per call, ms: p50 / p90 / max)")
    for k in ("remote_range", "whole_consume", "cached_range", "pread", "lookup"):
        s = res[k]
        print(f"  {k:14} {s['p50'] * 1e3:9.2f} {s['p90'] * 1e3:9.2f} {s['max'] * 1e3:9.2f}")
    print(f"  whole consume / remote range: {res['whole_over_remote_range']:.1f}x (goal >= 20x); "
          f"cached range / pread: {res['cached_range_over_pread']:.2f}x (goal <= 2x); "
          f"cached range / (pread + lookup): {res['cached_range_over_pread_plus_lookup']:.2f}x")
    bench_output.save("range", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
