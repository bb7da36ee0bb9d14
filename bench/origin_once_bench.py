#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Read-through that spares the shared file system (issue 49, item 4), on a
real GlusterFS volume (bench/workflow/gluster.py) mounted on 3
network-namespace nodes (bench/workflow/workflow.py's Env), the dataset on
it as DYAD_PATH_ORIGIN (each node its own mount of the volume).

Row 1, origin reads per file on N nodes: BENCH_ONCE_FILES files of
BENCH_ONCE_SIZE bytes (default 24 x 4 MiB); each round, every node reads
every file at the same time, each in its own order (rotated, as an epoch's
shuffle would), either
- gfs: straight from its GlusterFS mount (cat), or
- dyad: `dyad consume` of all files with DYAD_PATH_ORIGIN and
  DYAD_ORIGIN_PUBLISH=1 (a fresh metadata namespace and emptied node
  directories each round).
Counted with GlusterFS's own statistics (`gluster volume profile`, cleared
before each run): OPEN calls on the brick per file and Data Read bytes per
file size; and the run's wall time.

Row 2, a range re-read vs pread from GlusterFS, on node 0, one process:
BENCH_ONCE_RANGES ranges of BENCH_ONCE_RANGE bytes at random offsets of a
64 MiB file, per call latency of
- dyad-reread: pydyad consume_range, second pass (the blocks held);
- dyad-first: the same ranges' first pass (blocks read from GlusterFS);
- gfs-pread-cold: os.pread on an fd of the mount, the client's page cache
  of the file dropped before each (posix_fadvise DONTNEED): a read that
  reaches GlusterFS;
- gfs-pread-warm: os.pread, cache not dropped (a repeat read the kernel
  serves, when GlusterFS lets it).
median/p90/max of each and the ratios cold/reread and warm/reread.

BENCH_ONCE_ROWS: "reads,range" (default), or one of them (e.g. "range"
to measure only row 2). BENCH_ONCE_RECHECK: DYAD_ORIGIN_RECHECK for row 2
(unset: the library's default).

Results: $BENCH_OUT/origin_once.json. Needs root, /dev/fuse and GlusterFS
(make deps-bench); otherwise it says why and writes nothing.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "workflow"))
import harness  # noqa: E402
import bench_output  # noqa: E402
import workflow  # noqa: E402

NODES = int(os.environ.get("BENCH_ONCE_NODES", 3))
FILES = int(os.environ.get("BENCH_ONCE_FILES", 24))
SIZE = int(os.environ.get("BENCH_ONCE_SIZE", 4 << 20))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 3))
RANGES = int(os.environ.get("BENCH_ONCE_RANGES", 200))
RANGE = int(os.environ.get("BENCH_ONCE_RANGE", 64 << 10))
BIG = 64 << 20
ROWS = set(os.environ.get("BENCH_ONCE_ROWS", "reads,range").split(","))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(xs):
    return {"p50": statistics.median(xs), "p90": pct(xs, 0.9), "max": max(xs), "n": len(xs)}


def profile(env):
    """GlusterFS's own counts since the last clear: {fop: calls}, data read."""
    out = env.volume.cli("volume", "profile", workflow.gluster.VOLUME, "info", "cumulative").stdout
    calls, read = {}, 0
    for line in out.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+ [nu]s\s+[\d.]+ [nu]s\s+[\d.]+ [nu]s\s+(\d+)\s+([A-Z_]+)\s*$", line)
        if m:
            calls[m.group(2)] = calls.get(m.group(2), 0) + int(m.group(1))
        m = re.match(r"\s*Data Read:\s+(\d+) bytes", line)
        if m:
            read += int(m.group(1))
    return calls, read


def clear_profile(env):
    env.volume.cli("volume", "profile", workflow.gluster.VOLUME, "info", "clear")


def drop_client_caches(env, names):
    """Every node's page cache of the files dropped (posix_fadvise
    DONTNEED on its mount): each run's reads reach GlusterFS."""
    for n in env.nodes:
        for x in names:
            fd = os.open(os.path.join(env.mounts[n.name], x), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def epoch(env, names, method, ns):
    """Every node reads every file at once, each in its own order."""
    procs = []
    for i, n in enumerate(env.nodes):
        order = names[i * len(names) // NODES:] + names[:i * len(names) // NODES]
        if method == "gfs":
            mnt = env.mounts[n.name]
            cmd = ["sh", "-c", "cat " + " ".join(os.path.join(mnt, x) for x in order) + " > /dev/null"]
            e = env.plain_env()
        else:
            cmd = [harness.DYAD, "--json", "consume", *[n.path(x) for x in order]]
            e = n.env(DYAD_PATH_ORIGIN=env.mounts[n.name], DYAD_ORIGIN_PUBLISH=1,
                      DYAD_KVS_NAMESPACE=ns, DYAD_WAIT_TIMEOUT=300)
        procs.append(subprocess.Popen(n.prefix + cmd, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    actions = {}
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{method}: exit {p.returncode}: {err[-2000:]}")
        for line in out.splitlines():
            if line.startswith("{"):
                a = json.loads(line).get("action")
                actions[a] = actions.get(a, 0) + 1
    return actions


def reads_per_file(env, names, rounds):
    res = {"gfs": [], "dyad": []}
    for r in range(rounds):
        for method in (["gfs", "dyad"] if r % 2 == 0 else ["dyad", "gfs"]):
            for n in env.nodes:
                shutil.rmtree(n.path("ds"), ignore_errors=True)
            drop_client_caches(env, names)
            clear_profile(env)
            t0 = time.monotonic()
            actions = epoch(env, names, method, f"once-{uuid.uuid4().hex[:8]}")
            dt = time.monotonic() - t0
            calls, read = profile(env)
            row = {"wall_s": dt, "opens_per_file": calls.get("OPEN", 0) / len(names),
                   "bytes_read_per_file_size": read / (len(names) * SIZE), "actions": actions,
                   "fops": calls}
            res[method].append(row)
            log(f"round {r + 1}/{rounds} {method}: {dt:.2f} s, OPEN/file {row['opens_per_file']:.2f}, "
                f"read/size {row['bytes_read_per_file_size']:.2f}, actions {actions}")
    return res


RANGE_CODE = r"""
import json, os, random, sys, time
sys.path.insert(0, os.environ["DYAD_BENCH_PY"])
from pydyad import Dyad
src, target, n, size, big = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(7)
offs = [rng.randrange(0, big - size) for _ in range(n)]
d = Dyad(); d.init_env()
out = {}
def timed(fn):
    xs = []
    for o in offs:
        t0 = time.perf_counter(); b = fn(o); xs.append(time.perf_counter() - t0)
        assert len(b) == size
    return xs
out["dyad-first"] = timed(lambda o: d.consume_range(target, o, size))
out["dyad-reread"] = timed(lambda o: d.consume_range(target, o, size))
fd = os.open(src, os.O_RDONLY)
def cold(o):
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    t0 = time.perf_counter(); b = os.pread(fd, size, o); cold.t.append(time.perf_counter() - t0)
    return b
cold.t = []
for o in offs:
    cold(o)
out["gfs-pread-cold"] = cold.t
for o in offs:
    os.pread(fd, size, o)
out["gfs-pread-warm"] = timed(lambda o: os.pread(fd, size, o))
# The same bytes both ways.
assert d.consume_range(target, offs[0], size) == os.pread(fd, size, offs[0])
print(json.dumps(out))
"""


def range_rows(env, rounds):
    n = env.nodes[0]
    mnt = env.mounts[n.name]
    res = {}
    for r in range(rounds):
        rel = f"big/r{r}.bin"
        harness.write_file(os.path.join(mnt, rel), BIG, seed=r)
        shutil.rmtree(n.path(".dyad/origin-blocks"), ignore_errors=True)
        e = n.env(DYAD_PATH_ORIGIN=mnt, DYAD_LIBRARY=workflow.LIBDYAD, DYAD_WAIT_TIMEOUT=60,
                  DYAD_KVS_NAMESPACE=f"range-{uuid.uuid4().hex[:8]}",
                  DYAD_BENCH_PY=os.path.join(workflow.ROOT, "python"))
        if os.environ.get("BENCH_ONCE_RECHECK"):
            e["DYAD_ORIGIN_RECHECK"] = os.environ["BENCH_ONCE_RECHECK"]
        p = subprocess.run(n.prefix + [sys.executable, "-c", RANGE_CODE, os.path.join(mnt, rel), n.path(rel),
                                       str(RANGES), str(RANGE), str(BIG)],
                           env=e, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"range run: {p.stderr[-2000:]}")
        for k, xs in json.loads(p.stdout).items():
            res.setdefault(k, []).extend(xs)
        log(f"round {r + 1}/{rounds} ranges: " + ", ".join(
            f"{k} p50 {statistics.median(v) * 1e6:.0f} us" for k, v in json.loads(p.stdout).items()))
    return res


def main():
    why = workflow.unavailable_reason()
    if why:
        log(f"origin_once: skipped: {why}")
        return
    with workflow.Env(NODES) as env:
        env.volume.cli("volume", "profile", workflow.gluster.VOLUME, "start")
        mnt0 = env.mounts[env.nodes[0].name]
        names = [f"ds/s{i:04d}.bin" for i in range(FILES)]
        for i, x in enumerate(names):
            harness.write_file(os.path.join(mnt0, x), SIZE, seed=i)
        once = reads_per_file(env, names, ROUNDS) if "reads" in ROWS else {}
        ranges = range_rows(env, ROUNDS) if "range" in ROWS else {}
    res = {"nodes": NODES, "files": FILES, "size": SIZE, "rounds": ROUNDS, "origin": "GlusterFS",
           "reads_per_file": {}, "range": {"ranges": RANGES, "range_bytes": RANGE, "file_bytes": BIG}}
    for m, rows in once.items():
        res["reads_per_file"][m] = {
            "opens_per_file": summary([x["opens_per_file"] for x in rows]),
            "bytes_read_per_file_size": summary([x["bytes_read_per_file_size"] for x in rows]),
            "wall_s": summary([x["wall_s"] for x in rows]), "runs": rows}
    for k, xs in ranges.items():
        res["range"][k] = {kk: (vv * 1e6 if kk != "n" else vv) for kk, vv in summary(xs).items()}
        res["range"][k]["unit"] = "us"
    rr = res["range"]
    if ranges:
        for q in ("p50", "p90"):
            rr[f"ratio_cold_over_reread_{q}"] = rr["gfs-pread-cold"][q] / rr["dyad-reread"][q]
            rr[f"ratio_warm_over_reread_{q}"] = rr["gfs-pread-warm"][q] / rr["dyad-reread"][q]
    res["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    path = bench_output.save("origin_once", res)
    brief = {"reads_per_file": {m: {k: v for k, v in x.items() if k != "runs"}
                                for m, x in res["reads_per_file"].items()}, "range": rr}
    print(json.dumps(brief, indent=2))
    log(f"results: {path}")


if __name__ == "__main__":
    main()
