# SPDX-License-Identifier: Apache-2.0
"""Measurements shared by the transport rows of `make bench` (UCX, MARGO):
a large file consumed with several settings side by side with cp of the
same file, and many small files, on a running two-node Cluster."""
import json
import os
import subprocess
import time

import bench_output
import harness

# The sizes every transport row uses: BENCH_QUICK=1 checks the scripts.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.environ.get("BENCH_QUICK") == "1"
REPS = 1 if QUICK else 3
# Rounds of the transport rows (UCX, MARGO, AUTO), large files and small:
# this VM's noise is widest there (one method's three rounds measured
# 0.73-2.34 GB/s on 256 MiB, 1,800-5,000 files/s on 64 KiB), so 5, their
# median.
ROUNDS = 1 if QUICK else 5
BIG = (64 << 20) if QUICK else (256 << 20)
SMALL_N = 200 if QUICK else 1000


def save(name, results):
    """Writes a bench row's results to NAME.json under build/bench/ (see
    bench_output)."""
    path = bench_output.save(name, results)
    print(f"bench: results written to {os.path.relpath(path, os.getcwd())}", flush=True)


def prime_memory(directory, nbytes):
    """Writes and deletes a scratch file of nbytes (untimed).

    The next writer then gets recently freed page-cache pages. Without this,
    whichever method writes first in a round pays for fresh memory (very
    slow in a VM that backs guest memory lazily) and the methods that run
    after a deletion look several times faster than they are.
    """
    path = os.path.join(directory, ".bench-scratch")
    buf = bytes(1 << 20)
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(buf[:min(left, len(buf))])
    os.remove(path)


def cp_rate(src, dst_dir):
    """The machine's file-to-file ceiling for this file: cp on the same disk."""
    dst = os.path.join(dst_dir, "cp-baseline.bin")
    t = time.monotonic()
    subprocess.run(["cp", src, dst], check=True)
    dt = time.monotonic() - t
    os.unlink(dst)
    return os.path.getsize(src) / dt / 1e9


def big_file_rates(prod, cons, size, reps, variants, transfer=None):
    """GB/s per variant (name -> consumer env) and for "cp", `reps` rounds
    after a warm-up round, the order rotated each round: the wall time of the
    whole `dyad consume` process. When `transfer` is a dict, it gets the same
    rounds' rates over the transfer alone (`transfer_s`: from the fetch's
    start to the checked copy, without the process's start-up)."""
    harness.write_file(prod.path("big.bin"), size, seed=1)
    prod.dyad("produce", prod.path("big.bin"))
    source_hash = harness.sha256(prod.path("big.bin"))
    os.sync()
    order = list(variants) + ["cp"]
    runs = {k: [] for k in order}
    for r in range(reps + 1):
        for what in order[r % len(order):] + order[:r % len(order)]:
            # Every method, cp too, writes into recently freed memory, as in
            # bench.py's rows: otherwise the method after a pause pays for
            # cold memory (a fixed mode measured at half AUTO's speed with
            # AUTO choosing that very mode).
            prime_memory(cons.dir, size)
            if what == "cp":
                rate = cp_rate(prod.path("big.bin"), cons.dir)
            else:
                t = time.monotonic()
                p = cons.dyad("--json", "consume", cons.path("big.bin"),
                              env_extra={**variants[what], "DYAD_WAIT_TIMEOUT": 60})
                rate = size / (time.monotonic() - t) / 1e9
                if harness.sha256(cons.path("big.bin")) != source_hash:  # outside the timing
                    raise RuntimeError(f"{what}: the consumed copy differs from the produced file")
                os.unlink(cons.path("big.bin"))
                if r and transfer is not None:
                    report = json.loads(p.stdout.splitlines()[0])
                    transfer.setdefault(what, []).append(size / report["transfer_s"] / 1e9)
            if r:
                runs[what].append(rate)
    return runs


def small_file_times(prod, cons, count, reps, env, tag=""):
    """Seconds to consume `count` files of 64 KiB in one process, per round
    (files named after `tag` and the round, so runs never reuse a copy)."""
    times = []
    for r in range(reps):
        names = [f"s{tag}{r}/f{i:04d}" for i in range(count)]
        for i, n in enumerate(names):
            harness.write_file(prod.path(n), 65536, seed=i)
        prod.dyad("produce", *[prod.path(n) for n in names])
        # Earlier rounds' files are written back now, not during this one
        # (on disk, whichever method ran during a writeback measured up to
        # 2.5x slower: 1,800-5,000 files/s for the same mode).
        os.sync()
        t = time.monotonic()
        cons.dyad("consume", *[cons.path(n) for n in names], env_extra={**env, "DYAD_WAIT_TIMEOUT": 60}, timeout=600)
        times.append(time.monotonic() - t)
    return times
