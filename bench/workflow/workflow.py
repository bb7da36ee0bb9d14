# SPDX-License-Identifier: Apache-2.0
"""The workflow bench's cluster and runs (issue 39): DYAD against a real
GlusterFS volume on DYAD's own workloads, across network-namespace nodes.

Env(nodes): a harness cluster (scripts/harness.py, Cluster(netns="require"))
of `nodes` nodes, each a network namespace with its dyadd and its own
directory (node-local storage), plus one more namespace that serves a
GlusterFS volume (gluster.py) mounted on every node, and a plain node-local
directory per node (the local-disk reference).

run_md(...) and run_dl(...) run one measurement and return its figures;
bench/workflow/run.py runs the rounds and writes the tables and charts,
tests/integration/test_workflow.py runs them at a tiny size.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import harness  # noqa: E402
import gluster  # noqa: E402

PY = "/usr/bin/python3"
MD = os.path.join(HERE, "md_pair.py")
DL = os.path.join(HERE, "dl_reads.py")
WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
LIBDYAD = os.path.join(harness.BUILD, "lib", "libdyad.so")

# HiCOMB 2024's frame sizes (JAC, ApoA1, F1-ATPase, STMV).
FRAME_SIZES = {"644KiB": 644 << 10, "2.46MiB": int(2.46 * (1 << 20)), "8.75MiB": int(8.75 * (1 << 20)),
               "28.48MiB": int(28.48 * (1 << 20))}
MD_METHODS = ["local", "dyad-wrapper", "dyad-wrapper-async", "pydyad", "pydyad-async", "gfs-poll", "gfs-barrier"]
DL_METHODS = ["dyad", "gfs", "local"]


def unavailable_reason():
    return harness.netns_unavailable_reason() or gluster.unavailable_reason()


class Env:
    """nodes: the DYAD nodes (2 to 4); gfs: serve and mount a GlusterFS
    volume; trace_dir: DYAD_TRACE for every service and DYAD client."""

    def __init__(self, nodes, gfs=True, trace_dir=None):
        extra = {"DYAD_TRACE": trace_dir} if trace_dir else None
        self.cluster = harness.Cluster(nodes=nodes + 1, netns="require", start=False, env=extra)
        self.volume = None
        try:
            self.nodes = self.cluster.nodes[:nodes]
            server = self.cluster.nodes[nodes]  # its namespace serves the volume; no dyadd there
            self.server_ns = self.cluster.net.namespaces[f"n{nodes}"]
            for n in self.nodes:
                n.start()
            self.local = {}
            self.mounts = {}
            for i, n in enumerate(self.nodes):
                self.local[n.name] = os.path.join(self.cluster.root, f"local{i}")
                os.makedirs(self.local[n.name], exist_ok=True)
            if gfs:
                self.volume = gluster.Volume(self.cluster.root, self.server_ns, server.host).serve()
                for i, n in enumerate(self.nodes):
                    self.mounts[n.name] = self.volume.mount(n.name, self.cluster.net.namespaces[f"n{i}"])
        except BaseException:
            self.close()
            raise

    def close(self):
        try:
            if self.volume:
                self.volume.stop()
        finally:
            self.cluster.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def plain_env():
        e = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_") and k != "LD_PRELOAD"}
        e["PYTHONPATH"] = os.path.join(ROOT, "python")
        return e

    def dyad_env(self, node, preload=False):
        e = node.env(PYTHONPATH=os.path.join(ROOT, "python"), DYAD_LIBRARY=LIBDYAD, DYAD_WAIT_TIMEOUT=300)
        if preload:
            e.update(harness.preload_env(WRAPPER))
        return e

    def spawn(self, node, cmd, env, log):
        return subprocess.Popen(node.prefix + cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _tail(log, lines=8):
    log.flush()
    with open(log.name, errors="replace") as f:
        return "".join(f.readlines()[-lines:]).strip()


def _finish(procs, logs, timeout):
    """Waits for every process; as soon as one fails (or at the deadline)
    the others are killed: a consumer must not wait out its timeout for a
    producer that is gone. Raises with the failures' last lines."""
    deadline = time.monotonic() + timeout
    failed = []
    try:
        while True:
            running = [(w, p, log) for (w, p), log in zip(procs, logs) if p.poll() is None]
            failed = [f"{w}: exit {p.returncode}: {_tail(log)}" for (w, p), log in zip(procs, logs)
                      if p.returncode not in (None, 0)]
            if failed or not running:
                break
            if time.monotonic() > deadline:
                failed = [f"{w}: still running after {timeout:.0f} s (killed)" for w, _, _ in running]
                break
            time.sleep(0.02)
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    if failed:
        raise RuntimeError("workflow: " + "; ".join(failed))


def pair_nodes(env, pairs, nodes):
    """Pair p: producer on node p % nodes, consumer on the next node."""
    used = env.nodes[:nodes]
    return [(used[p % nodes], used[(p + 1) % nodes]) for p in range(pairs)]


def run_md(env, method, size, frames, pairs=1, nodes=2, sim=0.0, poll=0.005, keep=False, timeout=600):
    """One MD pipeline run of `method` (MD_METHODS); returns its figures
    (per pair: production, data movement and consumption seconds) and the
    per-frame values. keep: leave the files (tests compare them)."""
    run = f"md-{method}-{uuid.uuid4().hex[:8]}"
    work = os.path.join(env.cluster.root, run)
    os.makedirs(work)
    procs, logs, outs, dirs = [], [], [], []
    common = ["--frames", str(frames), "--size", str(size)]
    if method.startswith("gfs"):
        # The run's and the pairs' directories exist before the programs
        # start: concurrent mkdir of one path from several GlusterFS FUSE
        # clients was seen to fail (EEXIST, and then no such directory).
        for p in range(pairs):
            os.makedirs(os.path.join(env.mounts[env.nodes[0].name], run, f"pair{p}"))
    for p, (prod, cons) in enumerate(pair_nodes(env, pairs, nodes)):
        if method == "local":
            pd, cd, pmode, cmode, penv, cenv = env.local[prod.name], None, "plain", None, env.plain_env(), None
        elif method.startswith(("dyad-wrapper", "pydyad")):
            # "-async": the producer publishes with DYAD_ASYNC_PUBLISH=1
            # (a close returns once the file is queued).
            wrap = method.startswith("dyad-wrapper")
            pd, cd = prod.dir, cons.dir
            pmode = cmode = "plain" if wrap else "pydyad"
            penv, cenv = env.dyad_env(prod, preload=wrap), env.dyad_env(cons, preload=wrap)
            if method.endswith("-async"):
                penv["DYAD_ASYNC_PUBLISH"] = "1"
        else:
            pd, cd = env.mounts[prod.name], env.mounts[cons.name]
            pmode, cmode = "rename", method.split("-")[1]
            penv = cenv = env.plain_env()
        pdir = os.path.join(pd, run)
        cdir = os.path.join(cd, run) if cd else None
        dirs += [pdir] + ([cdir] if cdir else [])
        pout, cout = os.path.join(work, f"p{p}.json"), os.path.join(work, f"c{p}.json")
        if cmode:
            log = open(os.path.join(work, f"c{p}.log"), "w")
            procs.append((f"consumer {p} ({method}) on {cons.name}",
                          env.spawn(cons, [PY, MD, "consume", cmode, cdir, "--pair", str(p), *common,
                                           "--poll", str(poll), "--timeout", str(timeout), "--out", cout], cenv, log)))
            logs.append(log)
        log = open(os.path.join(work, f"p{p}.log"), "w")
        procs.append((f"producer {p} ({method}) on {prod.name}",
                      env.spawn(prod, [PY, MD, "produce", pmode, pdir, "--pair", str(p), *common, "--sim", str(sim),
                                       "--out", pout], penv, log)))
        logs.append(log)
        outs.append((pout, cout if cmode else None))
    _finish(procs, logs, timeout + 60)
    res = {"method": method, "size": size, "frames": frames, "pairs": pairs, "nodes": nodes, "sim": sim,
           "production": [], "movement": [], "consumption": [], "frame_movement": [], "frame_latency": [],
           "dirs": dirs}
    t_first, t_last = None, None
    for pout, cout in outs:
        with open(pout) as f:
            pj = json.load(f)
        t_first = min(t_first or pj["t_start"], pj["t_start"])
        res["production"].append(sum(fr["t_published"] - fr["t_write"] for fr in pj["frames"]))
        if not cout:
            continue
        with open(cout) as f:
            cj = json.load(f)
        mv = [c["t_done"] - max(c["t_begin"], pf["t_published"]) for c, pf in zip(cj["frames"], pj["frames"])]
        lat = [c["t_done"] - pf["t_published"] for c, pf in zip(cj["frames"], pj["frames"])]
        res["movement"].append(sum(mv))
        res["consumption"].append(sum(lat))
        res["frame_movement"] += mv
        res["frame_latency"] += lat
        res.setdefault("frame_done", []).extend(c["t_done"] for c in cj["frames"])
        t_last = max(t_last or cj["t_end"], cj["t_end"])
    res["wall"] = (t_last - t_first) if t_last else None
    for k in ("production", "movement", "consumption"):
        res[k] = statistics.mean(res[k]) if res[k] else None
    if not keep:
        cleanup_dirs(dirs + [work])
    return res


def cleanup_dirs(dirs):
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def produce_dl(env, method, count, size, producers, reader, run):
    """Writes the samples of a DL run (untimed): split over the producer
    nodes for dyad and gfs, on the reader's local disk for local. Returns
    the directory the reader reads."""
    procs, logs = [], []
    if method == "local":
        spots = [(reader, os.path.join(env.local[reader.name], run), "plain", env.plain_env())]
    elif method == "dyad":
        spots = [(n, os.path.join(n.dir, run), "pydyad", env.dyad_env(n)) for n in producers]
    else:
        spots = [(n, os.path.join(env.mounts[n.name], run), "plain", env.plain_env()) for n in producers]
        os.makedirs(os.path.join(spots[0][1], "samples"))  # once, before the producers (run_md says why)
    share = -(-count // len(spots))
    for k, (n, d, mode, e) in enumerate(spots):
        first, c = k * share, max(0, min(share, count - k * share))
        if c == 0:
            continue
        log = open(os.path.join(env.cluster.root, f"{run}-produce{k}.log"), "w")
        procs.append((f"producer {k} ({method}) on {n.name}",
                      env.spawn(n, [PY, DL, "produce", mode, d, "--first", str(first), "--count", str(c),
                                    "--size", str(size)], e, log)))
        logs.append(log)
    _finish(procs, logs, 1200)
    if method == "local":
        return spots[0][1]
    if method == "dyad":
        return os.path.join(reader.dir, run)
    return os.path.join(env.mounts[reader.name], run)


def run_dl(env, method, count, size, batch, epochs=2, workers=2, ahead=64, keep=False, timeout=1200):
    """One DL run: samples produced (untimed) on every node but the last,
    read on the last by a torch DataLoader. Returns per-epoch samples/s and
    batch waits."""
    run = f"dl-{method}-{uuid.uuid4().hex[:8]}"
    producers, reader = env.nodes[:-1], env.nodes[-1]
    rdir = produce_dl(env, method, count, size, producers, reader, run)
    out = os.path.join(env.cluster.root, f"{run}.json")
    e = env.dyad_env(reader) if method == "dyad" else env.plain_env()
    log = open(os.path.join(env.cluster.root, f"{run}-train.log"), "w")
    p = env.spawn(reader, [PY, DL, "train", "dyad" if method == "dyad" else "files", rdir, "--count", str(count),
                           "--size", str(size), "--batch", str(batch), "--epochs", str(epochs),
                           "--workers", str(workers), "--ahead", str(ahead), "--out", out], e, log)
    _finish([(f"reader ({method}) on {reader.name}", p)], [log], timeout)
    with open(out) as f:
        res = json.load(f)
    res.update({"count": count, "size": size, "batch": batch, "dir": rdir})
    if not keep:
        dirs = [rdir] + [os.path.join(n.dir, run) for n in producers]
        if method == "gfs":
            dirs = [rdir]
        cleanup_dirs(dirs + [out])
    return res


def wait_stats(waits):
    """mean, p99 and the share over 1 s of batch waits (seconds)."""
    w = sorted(waits)
    if not w:
        return {"mean": None, "p99": None, "over_1s": None}
    p99 = w[min(len(w) - 1, int(round(0.99 * (len(w) - 1))))]
    return {"mean": statistics.mean(w), "p99": p99, "over_1s": sum(1 for x in w if x > 1.0) / len(w)}
