#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Overhead of libdyad_wrapper.so on a program that never touches managed
files: open/read/close over 100,000 unmanaged files, with and without the
wrapper (active: DYAD_PATH_PRODUCER/CONSUMER set elsewhere), alternated,
median of 5 each. Goal: throughput ratio with/without >= 0.95."""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_output  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("DYAD_BUILD_DIR", os.path.join(ROOT, "build"))
LOOP = os.path.join(BUILD, "bin", "bench_open_loop")
WRAPPER = os.path.join(BUILD, "lib", "libdyad_wrapper.so")
N = int(os.environ.get("BENCH_OPEN_FILES", "100000"))
REPS = int(os.environ.get("BENCH_OPEN_REPS", "5"))


def main():
    tmp = tempfile.mkdtemp(prefix="dyad-openloop-")
    try:
        files = os.path.join(tmp, "files")
        managed = os.path.join(tmp, "managed")
        os.makedirs(managed)
        base = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_") and k != "LD_PRELOAD"}
        with_env = dict(base, LD_PRELOAD=WRAPPER, DYAD_PATH_PRODUCER=managed, DYAD_PATH_CONSUMER=managed,
                        DYAD_SERVICE_URI="tcp://127.0.0.1:1")
        subprocess.run([LOOP, files, str(N)], env=base, check=True, capture_output=True)  # create + warm
        without, withw = [], []
        for _ in range(REPS):
            for env, out in ((base, without), (with_env, withw)):
                p = subprocess.run([LOOP, files, str(N)], env=env, check=True, capture_output=True, text=True)
                out.append(float(p.stdout.split()[0]))
        m0, m1 = statistics.median(without), statistics.median(withw)
        ratio = m0 / m1
        print(f"\nWrapper overhead: open/read/close of {N} unmanaged files (median of {REPS}, alternated)")
        print(f"  {'':22} {'seconds':>9} {'opens/s':>10}")
        print(f"  {'without wrapper':22} {m0:9.3f} {N / m0:10.0f}")
        print(f"  {'with wrapper (active)':22} {m1:9.3f} {N / m1:10.0f}")
        print(f"  throughput ratio with/without: {ratio:.3f} (goal >= 0.95)")
        path = bench_output.save("wrapper_overhead", {"files": N, "reps": REPS, "without_s": without,
                                                      "with_s": withw, "ratio": ratio})
        print(f"bench: results written to {os.path.relpath(path, os.getcwd())}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
