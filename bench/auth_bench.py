#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The cost of authentication: the rows of bench.py (one 1 GiB file and
2,000 files of 64 KiB, node0 -> node1, one `dyad consume` each), on two
clusters side by side: one whose services and clients share a job key
(dyad keygen, dyadd --auth-key, DYAD_AUTH_KEY_FILE) and one without (loopback
only). Rounds interleave the two and rotate which goes first; medians of
the measured rounds after a warm-up. Every transfer is checked.

What authentication adds: a second round trip and two HMACs over the hello
transcript when a connection opens (connections are pooled: once per
consumer process and peer), and a 16-byte tag (keyed BLAKE2b over the
header and meta) on every later frame, both ways; file bytes are not
hashed by it. With or without a key, both clusters pay the publish through
the service and the served-file checks (an fstat at each end of a
transfer). BENCH_QUICK=1: 256 MiB and 200 files, 1 round. BENCH_DIR=/dev/shm
puts the nodes' directories there (takes the disk out of the comparison).

Writes auth.json under build/bench/ (bench_output.py). Run: make bench (or alone, after make build).
"""
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

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
REPS = int(os.environ.get("BENCH_REPS", 1 if QUICK else 3))
BIG = (256 if QUICK else 1024) << 20
COUNT = 200 if QUICK else 2000
SMALL = 64 << 10
RESULTS = bench_output.results_path("auth")
BENCH_DIR = os.environ.get("BENCH_DIR") or None


def log(msg):
    print(msg, flush=True)


def timed_consume(node, paths):
    t0 = time.perf_counter()
    node.dyad("consume", *paths, env_extra={"DYAD_DTL_MODE": "FLUX_RPC", "DYAD_WAIT_TIMEOUT": 60})
    return time.perf_counter() - t0


def big_round(c, tag):
    prod, cons = c[0], c[1]
    name = f"big-{tag}.bin"
    harness.write_file(prod.path(name), BIG, seed=len(tag))
    prod.dyad("produce", prod.path(name))
    dt = timed_consume(cons, [cons.path(name)])
    assert os.path.getsize(cons.path(name)) == BIG
    for p in (prod.path(name), cons.path(name)):
        os.unlink(p)
    return BIG / dt / 1e9


def small_round(c, tag):
    prod, cons = c[0], c[1]
    names = [f"s-{tag}/{i:05d}.bin" for i in range(COUNT)]
    for i, n in enumerate(names):
        harness.write_file(prod.path(n), SMALL, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    dt = timed_consume(cons, [cons.path(n) for n in names])
    for n in names[:: max(1, COUNT // 20)]:
        assert harness.sha256(prod.path(n)) == harness.sha256(cons.path(n)), n
    return COUNT / dt


def main():
    def root():
        return tempfile.mkdtemp(prefix="dyad-bench-", dir=BENCH_DIR) if BENCH_DIR else None

    clusters = {"key": harness.Cluster(nodes=2, auth=True, root=root()),
                "no key": harness.Cluster(nodes=2, auth=False, root=root())}
    rows = {"big": {k: [] for k in clusters}, "small": {k: [] for k in clusters}}
    try:
        order = list(clusters)
        for i in range(REPS + 1):
            tag = "warmup" if i == 0 else f"r{i}"
            for row, fn in (("big", big_round), ("small", small_round)):
                for name in order:
                    v = fn(clusters[name], f"{tag}-{name.replace(' ', '')}")
                    unit = "GB/s" if row == "big" else "files/s"
                    log(f"  {row:<5} {tag:<6} {name:<6} {v:8.2f} {unit}")
                    if i:
                        rows[row][name].append(v)
            order.reverse()
    finally:
        for c in clusters.values():
            c.cleanup()
    summary = {}
    log("")
    log(f"| row | with key | without key | ratio (key / no key) |")
    log("|---|---|---|---|")
    for row, unit in (("big", "GB/s"), ("small", "files/s")):
        k, n = statistics.median(rows[row]["key"]), statistics.median(rows[row]["no key"])
        summary[row] = {"key": k, "no_key": n, "ratio": k / n, "unit": unit,
                        "runs": rows[row]}
        label = f"{BIG >> 20} MiB, remote" if row == "big" else f"{COUNT} x 64 KiB, remote"
        log(f"| {label} | {k:.2f} {unit} | {n:.2f} {unit} | {k / n:.3f} |")
    # The hello alone, which is all the key adds (per pooled connection): a
    # `dyad consume` of many files from one owner opens two (its service,
    # the owner's), so the bound on the rows above is 2 x the difference.
    hs = None
    exe = os.path.join(harness.BUILD, "bin", "bench_handshake")
    if os.access(exe, os.X_OK):
        import subprocess
        hs = json.loads(subprocess.run([exe, "2000"], capture_output=True, text=True, check=True).stdout)
        extra_us = 2 * (hs["key_median_us"] - hs["no_key_median_us"])
        log(f"hello alone, median of {hs['connections']}: {hs['key_median_us']:.0f} us with the key, "
            f"{hs['no_key_median_us']:.0f} us without; 2 connections per consume process: "
            f"+{extra_us / 1000:.2f} ms, i.e. {extra_us / 1e6 / (COUNT / summary['small']['no_key']):.4%} "
            f"of the small-file row and {extra_us / 1e6 / (BIG / 1e9 / summary['big']['no_key']):.4%} of the big one")
        hs["extra_per_consume_us"] = extra_us
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"quick": QUICK, "reps": REPS, "bench_dir": BENCH_DIR, "handshake": hs, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "summary": summary}, f, indent=2)
        f.write("\n")
    log(f"bench: results written to {os.path.relpath(RESULTS, os.getcwd())}")


if __name__ == "__main__":
    main()
