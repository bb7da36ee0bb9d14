#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DYAD benchmark (issue 17's table): real dyadd services on loopback, each
row beside its references in the same run.

Small files (10,000 x 4 KiB and 2,000 x 64 KiB), on tmpfs (/dev/shm) and on
the disk (the system temporary directory, or BENCH_DIR): produced on node0
(untimed), then ONE `dyad consume` process on node1 listing every path,
beside an rsync daemon, tar | socat and cp -r.
One 1 GiB file: `dyad consume` beside a plain file -> socket -> file copy
(bench/plain_copy.c), cp and iperf3, with the CPU seconds per GiB of every
process involved.
Eight 256 MiB files consumed by eight `dyad consume` processes at once,
beside eight plain copies at once.
A 256 MiB file over UCX (UCX_TLS=tcp) and MARGO (ofi+tcp) beside the stream
(FLUX_RPC), through transport_runs.big_file_rates.
The AUTO rows are bench/auto_bench.py's; bench/goals.py prints all rows.

Each workload runs a warm-up round and 3 measured rounds (medians), every
round with fresh file names, the methods interleaved and their order rotated
from round to round, a scratch file the size of the data written and deleted
before each (prime_memory). Every copy is checked against its source outside
the timing. Syscalls per file come from one more, untimed round per small
workload with every process under `strace -f -c` (on tmpfs); context
switches and CPU seconds from the timed rounds (rusage of the processes the
bench starts, /proc of the dyadd services).

BENCH_QUICK=1: 1 round, few and small files, to check the script.
BENCH_SYNC=1: `sync` (untimed) before every timed step.
BENCH_DIR=/some/dir: the "disk" clusters' directory (default: the system
temporary directory).
BENCH_ONLY=concurrent: only the 8 x 256 MiB row, BENCH_ROUNDS (default 7)
interleaved rounds, p50/p90/max of each method and its context switches per
GiB (issue 38); writes concurrent.json instead of latest.json. Prints the table and writes latest.json under
build/bench/ (bench_output.py). Run: make bench
"""
import collections
import filecmp
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import accounting  # noqa: E402
import bench_output  # noqa: E402
import goals  # noqa: E402
import harness  # noqa: E402
import references  # noqa: E402
import transport_runs  # noqa: E402
from transport_runs import prime_memory  # noqa: E402
from accounting import Services, Strace, run_counted  # noqa: E402
from harness import Cluster, write_file  # noqa: E402
from references import measurement  # noqa: E402

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
REPS = 1 if QUICK else 3
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BIG_SIZE = (64 if QUICK else 1024) * MiB
# (files, bytes each) -> goals of DYAD / reference, files/s (None: shown)
SMALL = [(500 if QUICK else 10_000, 4 * KiB, {"rsync daemon": 1.0, "tar | socat": 0.5}),
         (200 if QUICK else 2_000, 64 * KiB, {"rsync daemon": 1.5, "tar | socat": None})]
CONCURRENT, CONCURRENT_SIZE = 8, (16 if QUICK else 256) * MiB
ONLY = os.environ.get("BENCH_ONLY", "")
GOAL_BIG, GOAL_CPU, GOAL_CONCURRENT, GOAL_TRANSPORT = 0.9, 1.5, 0.8, 1.0
SYNC = os.environ.get("BENCH_SYNC", "") not in ("", "0")
DISK_DIR = os.environ.get("BENCH_DIR") or tempfile.gettempdir()
TMPFS_DIR = "/dev/shm"
RESULTS = bench_output.results_path("latest")
DYAD_NAME = "DYAD"
METHOD_ORDER = [DYAD_NAME, "plain copy", "rsync daemon", "tar | socat", "cp -r", "cp", "iperf3"]  # in tables, charts

GB = 1e9
MB = 1e6


def log(msg):
    print(msg, flush=True)


def timed(fn, *args, **kw):
    if SYNC:
        os.sync()
    t0 = time.perf_counter()
    r = fn(*args, **kw)
    return time.perf_counter() - t0, r


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({p.returncode}): {p.stderr.strip()}")
    return p


def parse_consume(stdout, expected):
    recs = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    if len(recs) != expected:
        raise RuntimeError(f"dyad consume printed {len(recs)} records, expected {expected}")
    not_fetched = [r for r in recs if r.get("action") != "fetched"]
    if not_fetched:
        raise RuntimeError(f"{len(not_fetched)} files not fetched, e.g. {not_fetched[0]}")
    return recs


def same_file(a, b):
    return os.path.getsize(a) == os.path.getsize(b) and filecmp.cmp(a, b, shallow=False)


def check_copies(pairs, what):
    """Every (source, copy) identical (outside the timing)."""
    bad = [b for a, b in pairs if not os.path.exists(b) or not same_file(a, b)]
    if bad:
        raise RuntimeError(f"{what}: {len(bad)} of {len(pairs)} copies differ from their source, e.g. {bad[:2]}")


def rm(path):
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def is_tmpfs(path):
    try:
        with open("/proc/mounts") as f:
            return any(line.split()[1] == path and line.split()[2] == "tmpfs" for line in f)
    except OSError:
        return False


def dyadd_peak_rss_mib(node):
    """Peak resident memory (VmHWM) of a node's dyadd, or None."""
    try:
        with open(f"/proc/{node.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, AttributeError):
        pass
    return None


def rotated(methods, round_index):
    k = round_index % len(methods)
    return methods[k:] + methods[:k]


def size_text(n):
    return f"{n // GiB} GiB" if n >= GiB and n % GiB == 0 else f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


# ---------------------------------------------------------------- one bench cluster

class Bench:
    """A two-node cluster with the per-cluster reference state: node0 holds
    the files (its dyadd owns them, the rsync daemon serves its directory),
    node1 receives them."""

    def __init__(self, label, directory):
        self.label = label
        root = tempfile.mkdtemp(prefix="dyad-bench-", dir=directory)
        self.cluster = Cluster(nodes=2, root=root)
        self.n0, self.n1 = self.cluster[0], self.cluster[1]
        self.rsync = references.RsyncDaemon(root, self.n0.dir, self.n0.host)
        self.services = {"dyadd node0": self.n0.proc.pid, "dyadd node1": self.n1.proc.pid}

    def dyad_consume(self, paths_list, trace=None):
        """One `dyad --json consume` process per list of node1 paths, all
        started at once; timed until the last exits. Returns the measurement
        (its parts: the consumers and both dyadd) and every record."""
        svc = Services(self.services)
        svc.snapshot()
        if trace:
            for name, pid in self.services.items():
                trace.attach(name, pid)
        env = self.n1.env()
        procs = []
        try:
            t0 = time.perf_counter()
            for paths in paths_list:
                cmd = self.n1.prefix + [harness.DYAD, "--json", "consume", *paths]
                procs.append(accounting.start(trace.wrap("dyad consume", cmd) if trace else cmd, env=env))
            done = [accounting.finish(p) for p in procs]
            wall = time.perf_counter() - t0
        finally:
            for p in procs:
                accounting.abandon(p)
        parts = {"dyad consume": sum((u for _, u in done), accounting.ZERO), **svc.delta()}
        recs = [r for (out, _), paths in zip(done, paths_list) for r in parse_consume(out, len(paths))]
        m = measurement(wall, parts)
        m["transports"] = dict(collections.Counter(r.get("transport", "?") for r in recs))
        m["transfer_s_sum"] = sum(r.get("transfer_s", 0.0) for r in recs)
        return m

    def cleanup(self):
        self.rsync.kill()
        self.cluster.cleanup()


# ---------------------------------------------------------------- small files

def small_methods(b, reldir, names):
    """[(name, run(trace) -> measurement)] for one set of produced files;
    each checks its copies after its timed step."""
    src_dir = b.n0.path(reldir)
    host0, host1 = b.n0.host, b.n1.host

    def pairs(dst_dir):
        return [(os.path.join(src_dir, n), os.path.join(dst_dir, n)) for n in names]

    def dyad(trace=None):
        dst_dir = b.n1.path(reldir)
        m = b.dyad_consume([[os.path.join(dst_dir, n) for n in names]], trace)
        check_copies(pairs(dst_dir), "dyad consume")
        return m

    def rsync(trace=None):
        dst = b.n1.path(os.path.join("ref-rsync", reldir))
        m = references.rsync(b.rsync, reldir, dst, host1, trace)
        check_copies(pairs(dst), "rsync")
        return m

    def tar_socat(trace=None):
        dst = b.n1.path(os.path.join("ref-tar", reldir))
        m = references.tar_socat(src_dir, dst, host0, host1, trace)
        check_copies(pairs(dst), "tar | socat")
        return m

    def cp_r(trace=None):
        parent = b.n1.path(os.path.join("ref-cp", os.path.dirname(reldir)))
        os.makedirs(parent, exist_ok=True)
        cmd = ["cp", "-r", src_dir, parent]
        wall, _, usage = run_counted(trace.wrap("cp -r", cmd) if trace else cmd)
        check_copies(pairs(os.path.join(parent, os.path.basename(reldir))), "cp -r")
        return measurement(wall, {"cp -r": usage})

    return [(DYAD_NAME, dyad), ("rsync daemon", rsync), ("tar | socat", tar_socat), ("cp -r", cp_r)]


def produce_small(b, reldir, count, size, seed):
    names = [f"f{i:05d}.bin" for i in range(count)]
    for i, name in enumerate(names):
        write_file(b.n0.path(os.path.join(reldir, name)), size, seed=seed * 1_000_000 + i)
    t, _ = timed(b.n0.dyad, "produce", *[b.n0.path(os.path.join(reldir, n)) for n in names])
    return names, t


def small_round(b, count, size, tag, index, seed):
    # The files stay until the cluster is removed at the end: on ext4, creating
    # files shortly after deleting thousands of others is several times slower
    # (the inode allocator skips recently deleted inodes).
    reldir = os.path.join(f"small{size // KiB}k", tag)
    names, produce_s = produce_small(b, reldir, count, size, seed)
    r = {"produce_s": produce_s}
    order = rotated(small_methods(b, reldir, names), index)
    r["order"] = [name for name, _ in order]
    for name, method in order:
        prime_memory(b.n1.dir, count * size)
        if SYNC:
            os.sync()
        r[name] = method()
    return r


def small_accounting(b, count, size):
    """Untimed: every method once more with its processes under strace."""
    reldir = os.path.join(f"small{size // KiB}k", "strace")
    names, _ = produce_small(b, reldir, count, size, seed=999)
    res = {}
    for name, method in small_methods(b, reldir, names):
        trace = Strace(b.cluster.root, "acct")
        method(trace)
        res[name] = trace.counts()
    return res


# ---------------------------------------------------------------- large files

def big_round(b, iperf, tag, index, seed):
    n0, n1 = b.n0, b.n1
    rel = os.path.join("big", tag, "data.bin")
    src, dst = n0.path(rel), n1.path(rel)
    base_dst = n1.path(os.path.join("ref-big", tag, "data.bin"))
    write_file(src, BIG_SIZE, seed=seed)
    r = {}

    def dyad():
        r[DYAD_NAME] = b.dyad_consume([[dst]])
        check_copies([(src, dst)], "dyad consume")
        rm(dst)

    def plain():
        r["plain copy"] = references.plain_copies([(src, base_dst)], n0.host, n1.host)
        check_copies([(src, base_dst)], "plain copy")
        rm(base_dst)

    def cp():
        wall, _, usage = run_counted(["cp", src, base_dst])
        r["cp"] = measurement(wall, {"cp": usage})
        check_copies([(src, base_dst)], "cp")
        rm(base_dst)

    try:
        r["produce_s"], _ = timed(n0.dyad, "produce", src)
        os.makedirs(os.path.dirname(base_dst), exist_ok=True)
        order = rotated([(DYAD_NAME, dyad), ("plain copy", plain), ("cp", cp)], index)
        r["order"] = [name for name, _ in order]
        for _, method in order:
            prime_memory(n1.dir, BIG_SIZE)
            if SYNC:
                os.sync()
            method()
        if iperf.exe:  # writes no file: order does not matter
            ip = iperf.measure(BIG_SIZE)
            r["iperf3"] = {"s": BIG_SIZE * 8 / ip["bits_per_second"], **ip}
    finally:
        for p in (src, dst, base_dst):
            rm(os.path.dirname(p))
    return r


def concurrent_round(b, tag, index, seed):
    """CONCURRENT files of CONCURRENT_SIZE, one consumer (or plain copy) each, all at once."""
    n0, n1 = b.n0, b.n1
    rels = [os.path.join("conc", tag, f"c{i}.bin") for i in range(CONCURRENT)]
    srcs = [n0.path(x) for x in rels]
    dsts = [n1.path(x) for x in rels]
    base = [n1.path(os.path.join("ref-conc", x)) for x in rels]
    for i, s in enumerate(srcs):
        write_file(s, CONCURRENT_SIZE, seed=seed + i)
    os.makedirs(os.path.dirname(base[0]), exist_ok=True)
    r = {}

    def dyad():
        r[DYAD_NAME] = b.dyad_consume([[d] for d in dsts])
        check_copies(list(zip(srcs, dsts)), "dyad consume")
        for d in dsts:
            rm(d)

    def plain():
        r["plain copy"] = references.plain_copies(list(zip(srcs, base)), n0.host, n1.host)
        check_copies(list(zip(srcs, base)), "plain copy")
        for d in base:
            rm(d)

    try:
        r["produce_s"], _ = timed(n0.dyad, "produce", *srcs)
        order = rotated([(DYAD_NAME, dyad), ("plain copy", plain)], index)
        r["order"] = [name for name, _ in order]
        for _, method in order:
            prime_memory(n1.dir, CONCURRENT * CONCURRENT_SIZE)
            if SYNC:
                os.sync()
            method()
    finally:
        for p in (srcs[0], dsts[0], base[0]):
            rm(os.path.dirname(p))
    return r


def transport_rates():
    """GB/s of one 256 MiB file (BENCH_QUICK: 64 MiB) per fixed transport,
    interleaved rounds on one cluster whose services and consumers use
    UCX_TLS=tcp and DYAD_MARGO_PROTO=ofi+tcp; {} when none but the stream
    is built or works here."""
    import ofi_bench  # its protocol check (`dyad --json config`)
    variants = {"stream (FLUX_RPC)": {"DYAD_DTL_MODE": "FLUX_RPC"}}
    if "UCX" in harness.built_transports():
        variants["UCX (tcp)"] = {"DYAD_DTL_MODE": "UCX"}
    if "ofi+tcp" in ofi_bench.available():
        variants["MARGO (ofi+tcp)"] = {"DYAD_DTL_MODE": "MARGO"}
    if len(variants) == 1:
        return {}
    env = {"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n", "DYAD_MARGO_PROTO": "ofi+tcp"}
    transfer = {}
    with Cluster(nodes=2, env=env) as c:
        runs = transport_runs.big_file_rates(c[0], c[1], transport_runs.BIG, transport_runs.ROUNDS, variants,
                                             transfer=transfer)
    out = {"bytes": transport_runs.BIG, "runs_GBps": runs,
           "GBps": {k: statistics.median(v) for k, v in runs.items()},
           "transfer_GBps": {k: statistics.median(v) for k, v in transfer.items()}}
    if "MARGO (ofi+tcp)" in variants:
        out["libfabric_startup_s"] = ofi_bench.startup_seconds("ofi+tcp")
    return out


# ---------------------------------------------------------------- summary

def summarize(rounds, files=None, nbytes=None, syscalls=None):
    """Medians over the rounds, per method: seconds, the rate (files/s or
    GB/s) with its range, CPU seconds and context switches per file or per
    GiB, and syscalls per file (from the strace round) when given."""
    out = {}
    methods = sorted((k for k in rounds[0] if isinstance(rounds[0][k], dict)),
                     key=lambda k: METHOD_ORDER.index(k) if k in METHOD_ORDER else len(METHOD_ORDER))
    for name in methods:
        ms = [r[name] for r in rounds]
        secs = [m["s"] for m in ms]
        t = statistics.median(secs)
        d = {"s": t, "s_range": [min(secs), max(secs)], "s_p50": t, "s_p90": p90(secs), "s_max": max(secs)}
        if files:
            d.update({"files_per_s": files / t, "files_per_s_range": [files / max(secs), files / min(secs)]})
        if nbytes:
            d.update({"GBps": nbytes / t / GB, "GBps_range": [nbytes / max(secs) / GB, nbytes / min(secs) / GB]})
        if "cpu_s" in ms[0]:
            cpu, ctx = statistics.median(m["cpu_s"] for m in ms), statistics.median(m["ctxsw"] for m in ms)
            d.update({"cpu_s": cpu, "ctxsw": ctx,
                      "parts": {p: [statistics.median(m["parts"][p][i] for m in ms) for i in (0, 1)]
                                for p in ms[0]["parts"]}})
            if files:
                d.update({"cpu_ms_per_file": cpu / files * 1e3, "ctxsw_per_file": ctx / files})
            if nbytes:
                d.update({"cpu_s_per_GiB": cpu / (nbytes / GiB), "ctxsw_per_GiB": ctx / (nbytes / GiB)})
        if "transports" in ms[0]:
            d["transports"] = ms[0]["transports"]
        if syscalls and name in syscalls:
            total = sum(v["syscalls"] for v in syscalls[name].values())
            d["syscalls_per_file"] = total / files
            d["syscalls"] = syscalls[name]
        out[name] = d
    return out


def p90(xs):
    """The 90th percentile (nearest rank) of xs."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-9 * len(xs) // 10) - 1))]


def print_tails(label, wl):
    """p50/p90/max seconds and GB/s of each method of a workload, and the
    ratio of DYAD's to the reference's, median and p90."""
    m = wl["methods"]
    for name, d in m.items():
        log(f"  {label}: {name:<12} p50 {d['s_p50']:.3f} s ({wl['bytes'] / d['s_p50'] / GB:.2f} GB/s), "
            f"p90 {d['s_p90']:.3f} s ({wl['bytes'] / d['s_p90'] / GB:.2f} GB/s), max {d['s_max']:.3f} s"
            + (f"; {d['ctxsw_per_GiB']:,.0f} ctx sw/GiB, CPU {d['cpu_s_per_GiB']:.2f} s/GiB"
               if "ctxsw_per_GiB" in d else ""))
    if DYAD_NAME in m and "plain copy" in m:
        a, b = m[DYAD_NAME], m["plain copy"]
        log(f"  {label}: DYAD / plain copies: p50 {b['s_p50'] / a['s_p50']:.2f}x, p90 {b['s_p90'] / a['s_p90']:.2f}x "
            f"(goal >= {GOAL_CONCURRENT}x)")


def only_concurrent():
    """BENCH_ONLY=concurrent: the 8 x 256 MiB row alone, more rounds."""
    rounds_n = int(os.environ.get("BENCH_ROUNDS", "7"))
    b = Bench("disk", DISK_DIR)
    try:
        log(f"bench: {CONCURRENT} x {size_text(CONCURRENT_SIZE)} at once, {rounds_n} rounds + warm-up, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
        out = []
        for i in range(rounds_n + 1):
            tag = "warmup" if i == 0 else f"r{i}"
            r = concurrent_round(b, tag, i, i * 100_000 + 1)
            print_rounds(f"{CONCURRENT}x{size_text(CONCURRENT_SIZE)}", tag, r)
            if i:
                out.append(r)
        conc = {"bytes": CONCURRENT * CONCURRENT_SIZE, "rounds": out,
                "methods": summarize(out, nbytes=CONCURRENT * CONCURRENT_SIZE)}
    finally:
        b.cleanup()
    print_tails(f"{CONCURRENT} x {size_text(CONCURRENT_SIZE)}", conc)
    log(f"bench: load average at end {os.getloadavg()[0]:.2f}")
    path = bench_output.results_path("concurrent")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"git": git_rev(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "concurrent": conc}, f,
                  indent=2)
        f.write("\n")
    log(f"bench: results written to {os.path.relpath(path, os.getcwd())}")


def build_rows(small, big, conc, transports):
    rows = []
    for w in small:
        m = w["methods"]
        label = f"{w['files']:,} x {size_text(w['file_bytes'])}, {w['fs']}"
        for ref, goal in w["goals"].items():
            rows.append(goals.row(label, DYAD_NAME, m[DYAD_NAME]["files_per_s"], ref, m[ref]["files_per_s"],
                                  "files/s", goal))
    if big:
        m = big["methods"]
        label = f"{size_text(big['bytes'])} file"
        rows.append(goals.row(label, DYAD_NAME, m[DYAD_NAME]["GBps"], "plain copy", m["plain copy"]["GBps"],
                              "GB/s", GOAL_BIG))
        if "iperf3" in m:
            rows.append(goals.row(label, DYAD_NAME, m[DYAD_NAME]["GBps"], "iperf3 (no file)", m["iperf3"]["GBps"],
                                  "GB/s"))
        rows.append(goals.row(f"{label}, CPU s/GiB", DYAD_NAME, m[DYAD_NAME]["cpu_s_per_GiB"], "plain copy",
                              m["plain copy"]["cpu_s_per_GiB"], "CPU s/GiB", GOAL_CPU, lower_is_better=True))
    if transports:
        g = transports["GBps"]
        stream = "stream (FLUX_RPC)"
        for name in g:
            if name not in (stream, "cp"):
                rows.append(goals.row(f"{size_text(transports['bytes'])} file", name, g[name], stream, g[stream],
                                      "GB/s", GOAL_TRANSPORT))
        # The same rounds without each process's start-up (transfer_s):
        # shown, not judged; the goal is on the whole process.
        t = transports.get("transfer_GBps", {})
        for name in t:
            if name != stream and stream in t:
                rows.append(goals.row(f"{size_text(transports['bytes'])}, transfer only", name, t[name], stream,
                                      t[stream], "GB/s"))
    if conc:
        m = conc["methods"]
        rows.append(goals.row(f"{CONCURRENT} x {size_text(CONCURRENT_SIZE)} at once", DYAD_NAME, m[DYAD_NAME]["GBps"],
                              f"{CONCURRENT} plain copies", m["plain copy"]["GBps"], "GB/s", GOAL_CONCURRENT))
    return rows


def print_accounting(small, big, conc):
    log("")
    log("Cost per file (small files; syscalls from one strace round, the rest medians of the timed rounds)")
    log(f"  {'workload':<26}{'method':<15}{'files/s':>9}{'syscalls':>10}{'ctx sw':>8}{'CPU ms':>8}  "
        f"{'(per file; ctx sw and CPU of every process)'}")
    for w in small:
        label = f"{w['files']:,} x {size_text(w['file_bytes'])}, {w['fs']}"
        for name, d in w["methods"].items():
            sc = d.get("syscalls_per_file")
            log(f"  {label:<26}{name:<15}{d['files_per_s']:>9,.0f}{'-' if sc is None else f'{sc:.1f}':>10}"
                f"{d['ctxsw_per_file']:>8.2f}{d['cpu_ms_per_file']:>8.3f}")
            label = ""
    for what, wl in (("one file", big), (f"{CONCURRENT} at once", conc)):
        if not wl:
            continue
        log(f"  {size_text(wl['bytes'])} {what}: CPU s/GiB and ctx sw/GiB of every process: "
            + "; ".join(f"{name} {d['cpu_s_per_GiB']:.2f} s, {d['ctxsw_per_GiB']:,.0f}"
                        for name, d in wl["methods"].items() if "cpu_s_per_GiB" in d))
        for name in (DYAD_NAME, "plain copy"):
            parts = wl["methods"][name]["parts"]
            log(f"    {name}: " + ", ".join(f"{p} {v[0] / (wl['bytes'] / GiB):.2f} s" for p, v in parts.items()))
    first = next((w for w in small if DYAD_NAME in w["methods"] and "syscalls" in w["methods"][DYAD_NAME]), None)
    if first:
        log(f"  most frequent syscalls per {size_text(first['file_bytes'])} file (strace -f -c):")
        for name, d in first["methods"].items():
            for part, v in d.get("syscalls", {}).items():
                top = ", ".join(f"{k} {c / first['files']:.1f}" for k, c in list(v["top"].items())[:6])
                log(f"    {name:<14}{part:<22}{v['syscalls'] / first['files']:>7.1f}: {top}")


def print_rounds(kind, tag, r):
    parts = [f"{k} {r[k]['s']:.3f} s" for k in r if isinstance(r[k], dict)]
    log(f"  {kind:<14} {tag:<7} " + "  ".join(parts) + f"  [order {', '.join(r['order'])}]")


# ---------------------------------------------------------------- run

def log_problems(cluster):
    out = []
    for n in cluster.nodes:
        try:
            with open(n.log_path, errors="replace") as f:
                for line in f:
                    if " warn" in line or " error" in line or " critical" in line:
                        out.append(f"{n.name}: {line.rstrip()}")
        except OSError:
            pass
    return out


def cpu_busy_fraction(seconds=1.0):
    """Fraction of all CPUs busy over a short sample (before the bench starts)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
        return 1.0 - (i1 - i0) / max(1, t1 - t0)
    except OSError:
        return None


def binaries_mtime():
    return {os.path.basename(p): os.path.getmtime(p) for p in (harness.DYADD, harness.DYAD)}


def git_rev():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def measured_rounds(kind, fn):
    """Warm-up round plus REPS measured rounds of fn(tag, index, seed); the measured ones."""
    out = []
    for i in range(REPS + 1):
        tag = "warmup" if i == 0 else f"r{i}"
        r = fn(tag, i, i * 100_000 + 1)
        print_rounds(kind, tag, r)
        if i:
            out.append(r)
    return out


def run_small(b, fs, trace):
    res = []
    for count, size, goal in SMALL:
        rounds = measured_rounds(f"{count}x{size_text(size)} {fs}",
                                 lambda tag, i, seed: small_round(b, count, size, tag, i, seed))
        syscalls = small_accounting(b, count, size) if trace else None
        res.append({"fs": fs, "files": count, "file_bytes": size, "goals": goal, "rounds": rounds,
                    "methods": summarize(rounds, files=count, syscalls=syscalls)})
    return res


def main():
    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)

    for exe in (harness.DYADD, harness.DYAD):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench: {exe} not found; build first (make build)")
    if ONLY == "concurrent":
        return only_concurrent()
    if ONLY:
        sys.exit(f"bench: BENCH_ONLY={ONLY}: the only row that runs alone is 'concurrent'")
    missing = references.missing_tools()
    if [m for m in missing if m != "iperf3"] or not accounting.STRACE:
        sys.exit(f"bench: missing {', '.join(missing + ([] if accounting.STRACE else ['strace']))}: "
                 "run scripts/install-deps.sh (and make build)")
    iperf = references.Iperf3()
    if not iperf.exe:
        log("bench: iperf3 is not installed; its row is skipped (scripts/install-deps.sh installs it)")
    filesystems = [("tmpfs", TMPFS_DIR)] if is_tmpfs(TMPFS_DIR) else []
    if not filesystems:
        log(f"bench: {TMPFS_DIR} is not a tmpfs here: the tmpfs rows are skipped")
    filesystems.append(("disk", DISK_DIR))

    log(f"bench: {'QUICK ' if QUICK else ''}{'SYNC ' if SYNC else ''}{REPS} round(s) + warm-up; "
        + ", ".join(f"{c} x {size_text(s)}" for c, s, _ in SMALL)
        + f" on {' and '.join(f'{n} ({d})' for n, d in filesystems)}; {size_text(BIG_SIZE)}; "
        f"{CONCURRENT} x {size_text(CONCURRENT_SIZE)} at once; {os.cpu_count()} CPUs")
    load_start = os.getloadavg()
    busy = cpu_busy_fraction()
    log(f"bench: load average at start {load_start[0]:.2f}, CPUs busy before start "
        f"{'?' if busy is None else f'{busy:.0%}'}")
    if busy is not None and busy > 0.25:
        log("bench: WARNING: other processes are using the CPUs; results will be skewed")
    bins_before = binaries_mtime()
    started = time.perf_counter()
    small, big, conc, rss, problems, lock_files = [], None, None, {}, [], {}
    for fs, directory in filesystems:
        b = Bench(fs, directory)
        try:
            iperf.server_host, iperf.client_host = b.n0.host, b.n1.host
            log(f"bench: {fs} cluster in {b.cluster.root}: node0 {b.n0.uri} (metadata), node1 {b.n1.uri}")
            if fs == "disk":
                rounds = measured_rounds(f"{size_text(BIG_SIZE)}", lambda tag, i, seed: big_round(b, iperf, tag, i,
                                                                                                 seed))
                big = {"bytes": BIG_SIZE, "rounds": rounds, "methods": summarize(rounds, nbytes=BIG_SIZE)}
                rounds = measured_rounds(f"{CONCURRENT}x{size_text(CONCURRENT_SIZE)}",
                                         lambda tag, i, seed: concurrent_round(b, tag, i, seed))
                conc = {"bytes": CONCURRENT * CONCURRENT_SIZE, "rounds": rounds,
                        "methods": summarize(rounds, nbytes=CONCURRENT * CONCURRENT_SIZE)}
            small += run_small(b, fs, trace=(fs == filesystems[0][0]))
            rss[fs] = [dyadd_peak_rss_mib(n) for n in b.cluster.nodes]
            locks = os.path.join(b.n1.dir, ".dyad", "locks")
            lock_files[fs] = len(os.listdir(locks)) if os.path.isdir(locks) else 0
            problems += [f"{fs} {p}" for p in log_problems(b.cluster)]
        finally:
            iperf.stop()
            b.cleanup()
    log(f"bench: transports ({size_text(transport_runs.BIG)}, UCX_TLS=tcp, DYAD_MARGO_PROTO=ofi+tcp)")
    transports = transport_rates()
    for k, v in transports.get("runs_GBps", {}).items():
        log(f"  {k:<18} " + " ".join(f"{x:.2f}" for x in v) + " GB/s")
    if transports.get("libfabric_startup_s"):
        wall, cpu = transports["libfabric_startup_s"]
        log(f"  libfabric start-up in every MARGO process (`fi_info -p tcp` alone): {wall:.2f} s wall, "
            f"{cpu:.2f} s CPU")

    rows = build_rows(small, big, conc, transports)
    print_accounting(small, big, conc)
    if conc:
        print_tails(f"{CONCURRENT} x {size_text(CONCURRENT_SIZE)}", conc)
    goals.print_rows(rows, f"Issue 17 rows from bench.py (median of {REPS}, transport rows of {transport_runs.ROUNDS}; "
                           "ratio = DYAD / reference; "
                           "AUTO rows: bench/auto_bench.py, bench/goals.py)" + (" QUICK: not a measurement" if QUICK
                                                                                else ""), out=log)
    elapsed = time.perf_counter() - started
    load_end = os.getloadavg()
    rebuilt = binaries_mtime() != bins_before
    log("")
    log("dyadd peak RSS MiB (node0, node1): " + "; ".join(
        f"{fs} " + ", ".join("?" if v is None else f"{v:.0f}" for v in vals) for fs, vals in rss.items()))
    if problems:
        log(f"dyadd logged {len(problems)} warning/error line(s), first ones:")
        for line in problems[:10]:
            log("  " + line)
    if rebuilt:
        log("bench: WARNING: dyad/dyadd were rebuilt during the run; results mix two builds")
    log(f"consumer lock files left in node1/.dyad/locks: {lock_files}")
    log(f"bench: done in {elapsed:.0f} s; load average (1 min) at end {load_end[0]:.2f}")

    result = {
        "quick": QUICK, "sync_before_steps": SYNC, "reps": REPS, "warmup_rounds": 1,
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                 "iperf3": iperf.exe},
        "git": git_rev(),
        "loadavg_start": load_start, "loadavg_end": load_end, "cpu_busy_before": busy,
        "binaries_mtime": bins_before, "binaries_rebuilt_during_run": rebuilt,
        "filesystems": dict(filesystems),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": elapsed,
        "workloads": {"small": small, "big": big, "concurrent": conc, "transports": transports},
        "rows": rows,
        "dyadd_peak_rss_mib": rss,
        "dyadd_log_problems": problems[:100],
        "consumer_lock_files_left": lock_files,
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    log(f"bench: results written to {os.path.relpath(RESULTS, os.getcwd())}")


if __name__ == "__main__":
    main()
