#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What DYAD_TRACE costs: an unmodified `cat` under the LD_PRELOAD wrapper
consumes N small files from another node's dyadd (each open: wait-for-create,
transfer, commit), with tracing off and on, and, with --reference-build, with
the library of another build (e.g. one without tracing) side by side. Rounds
interleaved, each run into a fresh consumer directory; medians, p90 and max.

    /usr/bin/python3 bench/trace_overhead.py [--files N] [--size BYTES] [--rounds R]
                                             [--reference-build DIR]

Goal: off, consume throughput >= 0.98x the reference build's (one branch per
traced point); on, >= 0.90x off."""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import bench_output  # noqa: E402


def p90(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--trace-dir", help="where the traces go (default: a temporary directory)")
    ap.add_argument("--reference-build", help="a build directory whose libdyad_wrapper.so is the reference")
    a = ap.parse_args(argv)
    variants = []
    if a.reference_build:
        variants.append(("reference", os.path.join(a.reference_build, "lib", "libdyad_wrapper.so"), False))
    wrapper = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
    variants += [("off", wrapper, False), ("on", wrapper, True)]
    times = {name: [] for name, _, _ in variants}
    cpu = {name: [] for name, _, _ in variants}  # the consumer's user + system CPU seconds
    tmp = tempfile.mkdtemp(prefix="dyad-trace-bench-")
    try:
        with harness.Cluster(nodes=2) as c:
            src = c[0].path("tb")
            os.makedirs(src)
            names = [f"tb/{i:05d}.bin" for i in range(a.files)]
            for n in names:
                harness.write_file(c[0].path(n), a.size, seed=hash(n) & 0xFFFF)
            c[0].dyad("produce", "-r", src)
            run = 0
            for _ in range(a.rounds):
                for name, lib, trace in variants:
                    run += 1
                    cons = os.path.join(tmp, f"c{run}")
                    os.makedirs(cons)
                    extra = {"LD_PRELOAD": lib, "DYAD_PATH_CONSUMER": cons}
                    if trace:
                        extra["DYAD_TRACE"] = os.path.join(a.trace_dir or tmp, f"dyad-trace-bench-{os.getpid()}-{run}")
                    env = c[1].env(producer=False, consumer=False, **extra)
                    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    p = subprocess.run(["cat", *[os.path.join(cons, n) for n in names]], env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
                    dt = time.perf_counter() - t0
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[name].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                    if p.returncode != 0:
                        raise SystemExit(f"{name}: cat failed: {p.stderr[-2000:]}")
                    times[name].append(dt)
                    shutil.rmtree(cons, ignore_errors=True)
                    if trace:
                        shutil.rmtree(extra["DYAD_TRACE"], ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = "reference" if a.reference_build else "off"
    print(f"\nDYAD_TRACE cost: `cat` of {a.files} files of {a.size} B under the wrapper, other node's dyadd, "
          f"{a.rounds} interleaved rounds")
    for what, data in (("wall", times), ("consumer CPU (user+sys)", cpu)):
        b50 = statistics.median(data[base])
        print(f"  {what}:")
        print(f"    {'variant':10} {'p50 s':>8} {'p90 s':>8} {'max s':>8} {'files/s p50':>12} {'ratio to ' + base:>14}")
        for name, _, _ in variants:
            ts = data[name]
            m = statistics.median(ts)
            print(f"    {name:10} {m:8.3f} {p90(ts):8.3f} {max(ts):8.3f} {a.files / m:12.0f} {b50 / m:14.3f}")
    path = bench_output.save("trace_overhead", {"files": a.files, "size": a.size, "rounds": a.rounds,
                                                "seconds": times, "cpu_seconds": cpu, "reference": base})
    print(f"bench: results written to {os.path.relpath(path, os.getcwd())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
