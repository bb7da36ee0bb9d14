#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""pydyad.dlio's loader before and after a change, side by side in one run.

DLIO itself is not needed: the stand-in of DLIO that
tests/python/test_pydyad_dlio.py drives the loader with (its modules and
reader), here with a driver that times every step. Each rank is a process in
its own node (Cluster(netns=True): network namespaces where they can be
made), a dyadd each; rounds interleave the two loaders. Per loader: epoch 1
samples/s (samples this rank read / the epoch's wall time, summed over ranks)
and the p50/p90/p99 of the wait for each batch (pooled over ranks and
rounds, without a rank's first batch, the DataLoader's start), and the
ratios new/old per round.

    DYAD_BUILD_DIR=build python3 bench/dlio_loader_bench.py --old main --rounds 3

--old REV: the loader of git revision REV (python/pydyad/dlio.py there, the
rest of pydyad from this tree)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import test_pydyad_dlio as T  # noqa: E402  (the stand-in of DLIO)
from pydyad_testlib import harness, pyenv  # noqa: E402

DRIVER = r"""
import importlib, inspect, json, logging, math, os, sys, time
from dlio_benchmark.utils.config import ConfigArguments
from dlio_benchmark.common.enumerations import DatasetType
rank, world, data, files, per_file, batch, workers = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                                     *map(int, sys.argv[4:8]))
file_list = [os.path.join(data, "train", f"img_{f:02d}_of_{files}.npz") for f in range(files)]
args = ConfigArguments(my_rank=rank, comm_size=world, data_folder=data, file_list_train=file_list,
                       file_list_eval=[], num_samples_per_file=per_file, batch_size=batch,
                       total_samples_train=files * per_file, seed=123, seed_change_epoch=True,
                       read_threads=workers, multiprocessing_context="fork", prefetch_size=2 * workers,
                       pin_memory=False, train_global_index_map={})
from pydyad.dlio import DyadTorchDataLoader
loader = DyadTorchDataLoader("npz", DatasetType.TRAIN, 1)
loader.read()
print("ready", flush=True)
sys.stdin.readline()  # every rank staged: go
max_steps = math.floor(files * per_file / batch / world)
for epoch in (1, 2):
    waits, n, step = [], 0, 1
    t0 = t = time.perf_counter()
    for b in loader.next():
        now = time.perf_counter()
        waits.append(now - t)
        n += len(b)
        if step >= max_steps:
            break
        step += 1
        t = time.perf_counter()
    wall = time.perf_counter() - t0
    print(json.dumps({"epoch": epoch, "samples": n, "wall": wall, "waits": waits}), flush=True)
"""


def old_tree(rev, dest):
    """python/ of this tree with pydyad/dlio.py of `rev`."""
    shutil.copytree(os.path.join(ROOT, "python"), dest, ignore=shutil.ignore_patterns("__pycache__"))
    text = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:python/pydyad/dlio.py"], check=True,
                          capture_output=True, text=True).stdout
    with open(os.path.join(dest, "pydyad", "dlio.py"), "w") as f:
        f.write(text)


def one_run(cluster, tmp, pythonpath, a, tag):
    """Every rank through one loader; per rank its epochs' figures."""
    standin = os.path.join(tmp, "standin")
    procs = {}
    for r in range(a.nodes):
        node = cluster[r]
        cons = os.path.join(tmp, f"cons-{tag}-{r}")
        env = pyenv(node, consumer=False, DYAD_PATH_CONSUMER=cons, DYAD_WAIT_TIMEOUT=120,
                    DYAD_DLIO_PREFIX=f"ds-{tag}")
        if os.environ.get("DYAD_DLIO_DEBUG"):
            env["DYAD_DLIO_DEBUG"] = "1"
        if a.budget and tag.startswith("new"):
            env["DYAD_DLIO_INFLIGHT_BYTES"] = str(a.budget)
        env["PYTHONPATH"] = os.pathsep.join([standin, pythonpath])
        procs[r] = subprocess.Popen(node.prefix + [sys.executable, "-c", DRIVER, str(r), str(a.nodes),
                                                   os.path.join(tmp, f"data{r}"), str(a.files), str(a.per_file),
                                                   str(a.batch), str(a.workers)],
                                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=None if os.environ.get("DLIO_BENCH_STDERR") else subprocess.DEVNULL, text=True)
    for r, p in procs.items():
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"rank {r} ({tag}) did not stage: {line!r}")
    for p in procs.values():
        p.stdin.write("go\n")
        p.stdin.flush()
    out = {}
    for r, p in procs.items():
        text, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"rank {r} ({tag}) failed ({p.returncode})")
        out[r] = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
    for r in range(a.nodes):  # the next round of this loader starts with nothing here
        shutil.rmtree(os.path.join(tmp, f"cons-{tag}-{r}"), ignore_errors=True)
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default="main")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--per-file", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes of a file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=int, help="DYAD_DLIO_INFLIGHT_BYTES of the new loader")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    T.FILES, T.PER_FILE, T.RANKS = a.files, a.per_file, a.nodes
    tmp = tempfile.mkdtemp(prefix="dyad-dlio-bench-")
    cluster = harness.Cluster(nodes=a.nodes, netns=True)
    try:
        T.write_standin(os.path.join(tmp, "standin"))
        old = os.path.join(tmp, "old-python")
        old_tree(a.old, old)
        new = os.path.join(ROOT, "python")
        for f in range(a.files):  # rank r's dataset: the files it owns
            r = T.dlio_owner(f, a.files, a.per_file, a.nodes)
            T.write_sample_file(os.path.join(tmp, f"data{r}", "train", f"img_{f:02d}_of_{a.files}.npz"), f,
                                pad=a.size)
        rows = {"old": [], "new": []}
        for rnd in range(a.rounds):
            order = ("old", "new") if rnd % 2 == 0 else ("new", "old")
            for tag in order:
                res = one_run(cluster, tmp, old if tag == "old" else new, a, f"{tag}{rnd}")
                rows[tag].append(res)
                e1 = [res[r][0] for r in res]
                print(f"round {rnd} {tag}: epoch 1 {sum(e['samples'] / e['wall'] for e in e1):.1f} samples/s",
                      flush=True)
        report(rows, a, cluster.mode)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "rows": rows}, f)
    finally:
        cluster.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def report(rows, a, mode):
    print(f"\n{a.nodes} nodes ({mode}), {a.files} files of {a.size >> 10} KiB x {a.per_file} samples, "
          f"batch {a.batch}, {a.workers} worker(s), {a.rounds} interleaved rounds")
    print("| loader | epoch | samples/s (median of rounds) | batch wait p50 (ms) | p90 (ms) | p99 (ms) "
          "| first batch p50 (ms) |")
    print("|---|---|---|---|---|---|---|")
    rates = {}
    for tag in ("old", "new"):
        for ep in (0, 1):
            per_round = [sum(res[r][ep]["samples"] / res[r][ep]["wall"] for r in res) for res in rows[tag]]
            waits = [w * 1000 for res in rows[tag] for r in res for w in res[r][ep]["waits"][1:]]
            firsts = [res[r][ep]["waits"][0] * 1000 for res in rows[tag] for r in res if res[r][ep]["waits"]]
            rates[tag, ep] = per_round
            print(f"| {tag} | {ep + 1} | {statistics.median(per_round):.1f} | {pct(waits, .5):.2f} | "
                  f"{pct(waits, .9):.2f} | {pct(waits, .99):.2f} | {pct(firsts, .5):.1f} |")
    for ep in (0, 1):
        ratios = [n / o for n, o in zip(rates["new", ep], rates["old", ep])]
        print(f"epoch {ep + 1} samples/s new/old per round: {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
