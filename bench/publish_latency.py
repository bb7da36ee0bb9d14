#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The publish-latency row (issue 48): one dyad_produce of a 4 KiB file on
the producer's own node, synchronous and with DYAD_ASYNC_PUBLISH=1, beside a
bare round trip over the same kind of Unix socket (a small C echo server,
bench/publish_latency.c, request and answer of about a publish's size), in
interleaved rounds. Per-call p50, p90, p99 in microseconds; the async row
also gives the drain (dyad_finalize) per file, what the queue's thread takes
for each publish: (the calls' time + the drain) / N.

The service runs as in a job (a job key: every frame is authenticated; the
echo is not), on one node of scripts/harness.py, reached over its Unix
socket (DYAD_SERVICE_URI=unix:...).

Results: $BENCH_OUT/publish_latency.json (default build/bench). Knobs:
PL_N (calls per round and kind, default 400), PL_ROUNDS (5), PL_SIZE (4096),
PL_REQ / PL_ANS (the round trip's bytes, default 256 / 640)."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import bench_output  # noqa: E402

PROG = os.path.join(harness.BUILD, "bin", "bench_publish_latency")
N = int(os.environ.get("PL_N", "400"))
ROUNDS = int(os.environ.get("PL_ROUNDS", "5"))
SIZE = int(os.environ.get("PL_SIZE", "4096"))
REQ = int(os.environ.get("PL_REQ", "256"))
ANS = int(os.environ.get("PL_ANS", "640"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def run(args, env=None):
    p = subprocess.run([PROG, *args], env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr}")
    calls, drain = [], None
    for line in p.stdout.splitlines():
        if line.startswith("finalize "):
            drain = int(line.split()[1])
        elif line.strip():
            calls.append(int(line))
    return calls, drain


def main():
    tmp = tempfile.mkdtemp(prefix="dyad-pl-")
    sock = os.path.join(tmp, "echo.sock")
    echo = subprocess.Popen([PROG, "echo", sock, str(REQ), str(ANS)], stdout=subprocess.PIPE, text=True)
    echo.stdout.readline()
    c = harness.Cluster(nodes=1)
    try:
        node = c[0]
        base = node.env(consumer=False, DYAD_SERVICE_URI=node.unix_uri)
        kinds = {
            "sync": lambda: run(["produce", node.dir, str(N), str(SIZE)], dict(base, DYAD_ASYNC_PUBLISH="0")),
            "async": lambda: run(["produce", node.dir, str(N), str(SIZE)], dict(base, DYAD_ASYNC_PUBLISH="1")),
            "round trip": lambda: run(["rt", sock, str(N), str(REQ), str(ANS)]),
        }
        order = list(kinds)
        got = {k: [] for k in kinds}
        drains = []
        for r in range(ROUNDS):
            for k in order[r % 3:] + order[:r % 3]:  # interleaved, rotated
                calls, drain = kinds[k]()
                got[k] += calls[N // 10:]  # the first calls connect and warm up
                if k == "async" and drain is not None:
                    drains.append((sum(calls) + drain) / N)
        rows = {}
        for k, xs in got.items():
            rows[k] = {f"p{p}_us": round(pct(xs, p) / 1000.0, 1) for p in (50, 90, 99)}
            rows[k]["calls"] = len(xs)
        rows["async"]["drain_per_file_us"] = round(sorted(drains)[len(drains) // 2] / 1000.0, 1)
        rt50 = rows["round trip"]["p50_us"]
        print(f"publish latency: {SIZE}-byte file, {ROUNDS} interleaved rounds of {N} calls each "
              f"(round trip: {REQ} B out, {ANS} B back)")
        print(f"{'':12} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8} {'p50 / round trip':>17}")
        for k, row in rows.items():
            print(f"{k:12} {row['p50_us']:8} {row['p90_us']:8} {row['p99_us']:8} "
                  f"{row['p50_us'] / rt50:16.2f}x")
        print(f"async: {N} files queued and published in {rows['async']['drain_per_file_us']} us each "
              f"(the calls and dyad_finalize's drain, / {N}; p50 of the rounds)")
        path = bench_output.save("publish_latency", {"size": SIZE, "n": N, "rounds": ROUNDS, "req": REQ,
                                                     "ans": ANS, "rows": rows})
        print(f"results: {path}")
    finally:
        c.cleanup()
        echo.kill()


if __name__ == "__main__":
    main()
