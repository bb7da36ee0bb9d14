#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DYAD benchmark: real dyadd services on loopback, compared with baselines.

Workload 1: one large file (1 GiB) produced on node0 and consumed on node1,
            next to iperf3 over the same loopback addresses and a plain `cp`.
Workload 2: 2,000 files of 64 KiB, produced in one `dyad produce` call and
            consumed in one `dyad consume` call, next to `cp -r`.

Each workload runs a warm-up round and then 3 measured rounds (median
reported), every round with fresh file names, and the baselines interleaved
with DYAD in the same round. The order of the file-writing methods rotates
from round to round, and before each of them a scratch file of the same size
is written and deleted (untimed), so that each writer starts from the same
memory state (see prime_memory). BENCH_QUICK=1: 1 round, 256 MiB and 200 files.
BENCH_SYNC=1: run `sync` (untimed) before every timed step, to keep the
writeback of earlier steps out of the measurements. Page cache is never dropped.
BENCH_DIR=/some/dir: put the simulated nodes' directories there (default: the
system temporary directory, like the harness), e.g. /dev/shm to take the disk
and file system out of the picture.

Prints a table and writes latest.json under build/bench/ (bench_output.py;
bench/results/ holds tracked reference results). Run: make bench
"""
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

import bench_output  # noqa: E402
import harness  # noqa: E402
from harness import Cluster, free_port, write_file  # noqa: E402

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
REPS = 1 if QUICK else 3
BIG_SIZE = (256 if QUICK else 1024) << 20
SMALL_COUNT = 200 if QUICK else 2000
SMALL_SIZE = 64 << 10
SYNC = os.environ.get("BENCH_SYNC", "") not in ("", "0")
BENCH_DIR = os.environ.get("BENCH_DIR") or None
RESULTS = bench_output.results_path("latest")

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


def rm(path):
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


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


# ---------------------------------------------------------------- iperf3

def tcp_listening(host, port):
    want = "%08X:%04X" % (int.from_bytes(bytes(map(int, host.split("."))), "little"), port)
    try:
        with open("/proc/net/tcp") as f:
            return any(l.split()[1] == want and l.split()[3] == "0A" for l in f.readlines()[1:])
    except OSError:
        return False


class Iperf3:
    """One-shot iperf3 server on node0's address, client bound to node1's."""

    def __init__(self):
        self.exe = shutil.which("iperf3")
        self.server = None
        self.server_host, self.client_host = "127.0.0.1", "127.0.0.2"

    def measure(self, nbytes):
        host = self.server_host
        port = free_port(host)
        self.server = subprocess.Popen(
            [self.exe, "-s", "-B", host, "-p", str(port), "-1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # no probe connection: it would be the one client of `-1`
            deadline = time.monotonic() + 10
            while not tcp_listening(host, port):
                if self.server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("iperf3 server did not start listening")
                time.sleep(0.02)
            wall, p = timed(run, [self.exe, "-c", host, "-B", self.client_host, "-p", str(port),
                                  "-n", str(nbytes), "-J"], timeout=300)
            rx = json.loads(p.stdout)["end"]["sum_received"]
            self.server.wait(timeout=10)
            return {"bits_per_second": rx["bits_per_second"], "bytes": rx["bytes"],
                    "seconds": rx["seconds"], "client_wall_s": wall}
        finally:
            self.stop()

    def stop(self):
        if self.server and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        self.server = None


# ---------------------------------------------------------------- workloads

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


def rotated(methods, round_index):
    k = round_index % len(methods)
    return methods[k:] + methods[:k]


def big_round(cluster, iperf, tag, index, seed):
    n0, n1 = cluster[0], cluster[1]
    rel = os.path.join("big", tag, "data.bin")
    src = n0.path(rel)
    dst = n1.path(rel)
    base_dst = n1.path(os.path.join("base-big", tag, "data.bin"))
    write_file(src, BIG_SIZE, seed=seed)
    r = {}

    def dyad_consume():
        r["consume_wall_s"], p = timed(n1.dyad, "--json", "consume", dst)
        rec = parse_consume(p.stdout, 1)[0]
        if rec["bytes"] != BIG_SIZE or not same_file(src, dst):
            raise RuntimeError(f"consumed copy of {rel} differs from the produced file")
        r["transfer_s"] = rec["transfer_s"]
        r["wait_s"] = rec["wait_s"]
        rm(dst)

    def cp():
        r["cp_s"], _ = timed(run, ["cp", src, base_dst])
        if os.path.getsize(base_dst) != BIG_SIZE:
            raise RuntimeError("cp copied the wrong number of bytes")
        rm(base_dst)

    def dd():
        # informational: cp uses copy_file_range (in-kernel); dd copies through
        # user space with read()+write() like a network receiver has to
        r["dd_s"], _ = timed(run, ["dd", f"if={src}", f"of={base_dst}", "bs=1M", "status=none"])
        if os.path.getsize(base_dst) != BIG_SIZE:
            raise RuntimeError("dd copied the wrong number of bytes")
        rm(base_dst)

    try:
        r["produce_s"], _ = timed(n0.dyad, "produce", src)
        os.makedirs(os.path.dirname(base_dst), exist_ok=True)
        order = rotated([("dyad", dyad_consume), ("cp", cp), ("dd", dd)], index)
        r["order"] = [name for name, _ in order]
        for _, method in order:
            prime_memory(n1.dir, BIG_SIZE)
            method()
        if iperf.exe:  # writes no file: order does not matter
            r["iperf3"] = iperf.measure(BIG_SIZE)
    finally:
        rm(os.path.dirname(src))
        rm(os.path.dirname(dst))
        rm(os.path.dirname(base_dst))
    return r


def small_round(cluster, tag, index, seed):
    n0, n1 = cluster[0], cluster[1]
    reldir = os.path.join("small", tag)
    src_dir = n0.path(reldir)
    dst_dir = n1.path(reldir)
    cp_parent = n1.path(os.path.join("base-small", tag))
    names = [f"f{i:05d}.bin" for i in range(SMALL_COUNT)]
    for i, name in enumerate(names):
        write_file(os.path.join(src_dir, name), SMALL_SIZE, seed=seed * 1_000_000 + i)
    r = {}

    def dyad_consume():
        r["consume_wall_s"], p = timed(n1.dyad, "--json", "consume",
                                       *[os.path.join(dst_dir, n) for n in names])
        recs = parse_consume(p.stdout, SMALL_COUNT)
        r["transfer_s_sum"] = sum(x["transfer_s"] for x in recs)
        r["wait_s_sum"] = sum(x["wait_s"] for x in recs)
        r["bytes"] = sum(x["bytes"] for x in recs)
        bad = [n for n in names if not same_file(os.path.join(src_dir, n), os.path.join(dst_dir, n))]
        if r["bytes"] != SMALL_COUNT * SMALL_SIZE or bad:
            raise RuntimeError(f"{len(bad)} consumed files differ, e.g. {bad[:3]}")

    def cp_r():
        os.makedirs(cp_parent, exist_ok=True)
        r["cp_r_s"], _ = timed(run, ["cp", "-r", src_dir, cp_parent])
        if len(os.listdir(os.path.join(cp_parent, tag))) != SMALL_COUNT:
            raise RuntimeError("cp -r copied the wrong number of files")

    # The files stay until the cluster is removed at the end: on ext4, creating
    # files shortly after deleting thousands of others is several times slower
    # (the inode allocator skips recently deleted inodes), which would slow
    # every later round of both DYAD and cp -r. 3 x 128 MiB per round is fine.
    r["produce_s"], _ = timed(n0.dyad, "produce", *[os.path.join(src_dir, n) for n in names])
    order = rotated([("dyad", dyad_consume), ("cp -r", cp_r)], index)
    r["order"] = [name for name, _ in order]
    for _, method in order:
        prime_memory(n1.dir, SMALL_COUNT * SMALL_SIZE)
        method()
    return r


# ---------------------------------------------------------------- report

def med(rounds, *keys):
    vals = []
    for r in rounds:
        for k in keys:
            r = r[k]
        vals.append(r)
    return statistics.median(vals), min(vals), max(vals)


def summarize(big, small, iperf_ok):
    s = {}
    t, lo, hi = med(big, "consume_wall_s")
    s["big"] = {
        "bytes": BIG_SIZE,
        "dyad_consume_wall_s": t, "dyad_consume_wall_GBps": BIG_SIZE / t / GB,
        "dyad_consume_wall_GBps_range": [BIG_SIZE / hi / GB, BIG_SIZE / lo / GB],
    }
    t, lo, hi = med(big, "transfer_s")
    s["big"].update({"dyad_transfer_s": t, "dyad_transfer_GBps": BIG_SIZE / t / GB,
                     "dyad_transfer_GBps_range": [BIG_SIZE / hi / GB, BIG_SIZE / lo / GB]})
    t, lo, hi = med(big, "produce_s")
    s["big"]["dyad_produce_s"] = t
    t, lo, hi = med(big, "cp_s")
    s["big"].update({"cp_s": t, "cp_GBps": BIG_SIZE / t / GB,
                     "cp_GBps_range": [BIG_SIZE / hi / GB, BIG_SIZE / lo / GB]})
    if iperf_ok:
        bps, lo, hi = med(big, "iperf3", "bits_per_second")
        s["big"].update({"iperf3_GBps": bps / 8 / GB, "iperf3_GBps_range": [lo / 8 / GB, hi / 8 / GB],
                         "iperf3_s": BIG_SIZE / (bps / 8)})
        s["big"]["ratio_dyad_wall_vs_iperf3"] = s["big"]["dyad_consume_wall_GBps"] / s["big"]["iperf3_GBps"]
        s["big"]["ratio_dyad_transfer_vs_iperf3"] = s["big"]["dyad_transfer_GBps"] / s["big"]["iperf3_GBps"]
    t, lo, hi = med(big, "dd_s")
    s["big"].update({"dd_s": t, "dd_GBps": BIG_SIZE / t / GB,
                     "dd_GBps_range": [BIG_SIZE / hi / GB, BIG_SIZE / lo / GB]})
    s["big"]["ratio_dyad_wall_vs_dd"] = s["big"]["dyad_consume_wall_GBps"] / s["big"]["dd_GBps"]
    s["big"]["ratio_dyad_wall_vs_cp"] = s["big"]["dyad_consume_wall_GBps"] / s["big"]["cp_GBps"]
    s["big"]["ratio_dyad_transfer_vs_cp"] = s["big"]["dyad_transfer_GBps"] / s["big"]["cp_GBps"]

    n, total = SMALL_COUNT, SMALL_COUNT * SMALL_SIZE
    s["small"] = {"files": n, "file_bytes": SMALL_SIZE}
    for key, name in (("produce_s", "dyad_produce"), ("consume_wall_s", "dyad_consume"), ("cp_r_s", "cp_r")):
        t, lo, hi = med(small, key)
        s["small"].update({f"{name}_s": t, f"{name}_files_per_s": n / t, f"{name}_MBps": total / t / MB,
                           f"{name}_files_per_s_range": [n / hi, n / lo]})
    s["small"]["dyad_transfer_s_sum"] = med(small, "transfer_s_sum")[0]
    s["small"]["ratio_dyad_consume_vs_cp_r"] = s["small"]["cp_r_s"] / s["small"]["dyad_consume_s"]
    return s


def fmt_range(r, digits=2):
    return f"{r[0]:.{digits}f}-{r[1]:.{digits}f}"


def print_table(s, iperf_ok):
    b = s["big"]
    size = f"{BIG_SIZE >> 20} MiB" if BIG_SIZE < (1 << 30) else f"{BIG_SIZE >> 30} GiB"
    log("")
    log(f"Workload 1: one {size} file, node0 -> node1 (median of {REPS}, range over rounds)")
    log(f"  {'method':<34}{'time s':>9}{'GB/s':>9}   {'range GB/s':<13}{'DYAD wall/this':>16}")
    rows = [("DYAD consume (CLI wall time)", b["dyad_consume_wall_s"], b["dyad_consume_wall_GBps"],
             b["dyad_consume_wall_GBps_range"]),
            ("DYAD consume (reported transfer_s)", b["dyad_transfer_s"], b["dyad_transfer_GBps"],
             b["dyad_transfer_GBps_range"])]
    if iperf_ok:
        rows.append((f"iperf3 TCP {b['iperf3_path']}", b["iperf3_s"], b["iperf3_GBps"], b["iperf3_GBps_range"]))
    else:
        rows.append(("iperf3 (not installed: skipped)", None, None, None))
    rows.append(("cp node0 dir -> node1 dir", b["cp_s"], b["cp_GBps"], b["cp_GBps_range"]))
    rows.append(("(info) dd bs=1M, user-space copy", b["dd_s"], b["dd_GBps"], b["dd_GBps_range"]))
    for name, t, g, rg in rows:
        if t is None:
            log(f"  {name:<34}{'-':>9}{'-':>9}")
            continue
        ratio = b["dyad_consume_wall_GBps"] / g
        log(f"  {name:<34}{t:>9.3f}{g:>9.2f}   {fmt_range(rg):<13}{ratio:>16.2f}")
    log(f"  dyad produce of the file: {b['dyad_produce_s']:.3f} s")
    if iperf_ok:
        log(f"  ratio DYAD/iperf3: {b['ratio_dyad_wall_vs_iperf3']:.2f} (wall), "
            f"{b['ratio_dyad_transfer_vs_iperf3']:.2f} (transfer_s)")
    log(f"  ratio DYAD/cp:     {b['ratio_dyad_wall_vs_cp']:.2f} (wall), "
        f"{b['ratio_dyad_transfer_vs_cp']:.2f} (transfer_s)")
    log(f"  ratio DYAD/dd:     {b['ratio_dyad_wall_vs_dd']:.2f} (wall; dd is not a requested baseline)")

    m = s["small"]
    log("")
    log(f"Workload 2: {m['files']} files x {SMALL_SIZE >> 10} KiB, node0 -> node1 (median of {REPS})")
    log(f"  {'method':<34}{'time s':>9}{'files/s':>10}{'MB/s':>9}   {'range files/s':<15}")
    for name, key in (("DYAD produce (one call, all files)", "dyad_produce"),
                      ("DYAD consume (one call, all files)", "dyad_consume"),
                      ("cp -r node0 dir -> node1 dir", "cp_r")):
        log(f"  {name:<34}{m[key + '_s']:>9.3f}{m[key + '_files_per_s']:>10.0f}{m[key + '_MBps']:>9.1f}   "
            f"{fmt_range(m[key + '_files_per_s_range'], 0):<15}")
    log(f"  sum of per-file transfer_s: {m['dyad_transfer_s_sum']:.3f} s")
    log(f"  ratio DYAD consume / cp -r (files/s): {m['ratio_dyad_consume_vs_cp_r']:.2f}")


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


def main():
    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)

    for exe in (harness.DYADD, harness.DYAD):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench: {exe} not found; build first (make build)")
    iperf = Iperf3()
    if not iperf.exe:
        log("bench: iperf3 is not installed; skipping the iperf3 baseline "
            "(scripts/install-deps.sh installs it)")

    log(f"bench: {'QUICK ' if QUICK else ''}{'SYNC ' if SYNC else ''}{REPS} round(s) + warm-up; "
        f"big file {BIG_SIZE >> 20} MiB, {SMALL_COUNT} x {SMALL_SIZE >> 10} KiB files; "
        f"{os.cpu_count()} CPUs")
    load_start = os.getloadavg()
    busy = cpu_busy_fraction()
    log(f"bench: load average at start {load_start[0]:.2f}, CPUs busy before start "
        f"{'?' if busy is None else f'{busy:.0%}'}")
    if busy is not None and busy > 0.25:
        log("bench: WARNING: other processes are using the CPUs; results will be skewed")
    bins_before = binaries_mtime()
    started = time.perf_counter()
    root = tempfile.mkdtemp(prefix="dyad-bench-", dir=BENCH_DIR) if BENCH_DIR else None
    cluster = Cluster(nodes=2, root=root)
    try:
        iperf.server_host, iperf.client_host = cluster[0].host, cluster[1].host
        log(f"bench: cluster in {cluster.root}: node0 {cluster[0].uri} (metadata), node1 {cluster[1].uri}")
        big, small = [], []
        for i in range(REPS + 1):
            tag = "warmup" if i == 0 else f"r{i}"
            r = big_round(cluster, iperf, tag, i, seed=i * 100_000)
            msg = (f"  big   {tag:<7} consume {r['consume_wall_s']:.3f} s (transfer {r['transfer_s']:.3f} s)"
                   f"  cp {r['cp_s']:.3f} s  dd {r['dd_s']:.3f} s")
            if "iperf3" in r:
                msg += f"  iperf3 {r['iperf3']['bits_per_second'] / 8 / GB:.2f} GB/s"
            log(msg + f"  [order {', '.join(r['order'])}]")
            if i:
                big.append(r)
        rss_after_big = [dyadd_peak_rss_mib(n) for n in cluster.nodes]
        for i in range(REPS + 1):
            tag = "warmup" if i == 0 else f"r{i}"
            r = small_round(cluster, tag, i, seed=i + 1)
            log(f"  small {tag:<7} produce {r['produce_s']:.3f} s  consume {r['consume_wall_s']:.3f} s"
                f"  cp -r {r['cp_r_s']:.3f} s  [order {', '.join(r['order'])}]")
            if i:
                small.append(r)
        rss_end = [dyadd_peak_rss_mib(n) for n in cluster.nodes]
        locks = os.path.join(cluster[1].dir, ".dyad", "locks")
        lock_files = len(os.listdir(locks)) if os.path.isdir(locks) else 0
        problems = log_problems(cluster)
    finally:
        iperf.stop()
        cluster.cleanup()

    iperf_ok = bool(iperf.exe)
    s = summarize(big, small, iperf_ok)
    if iperf_ok:
        s["big"]["iperf3_path"] = f"{iperf.client_host} -> {iperf.server_host}"
    print_table(s, iperf_ok)
    elapsed = time.perf_counter() - started
    load_end = os.getloadavg()
    rebuilt = binaries_mtime() != bins_before
    log("")
    log("dyadd peak RSS MiB (node0, node1): after workload 1 "
        + ", ".join("?" if v is None else f"{v:.0f}" for v in rss_after_big)
        + "; at end " + ", ".join("?" if v is None else f"{v:.0f}" for v in rss_end))
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
        "config": {"big_bytes": BIG_SIZE, "small_files": SMALL_COUNT, "small_bytes": SMALL_SIZE},
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                 "iperf3": iperf.exe},
        "git": git_rev(),
        "loadavg_start": load_start, "loadavg_end": load_end, "cpu_busy_before": busy,
        "binaries_mtime": bins_before, "binaries_rebuilt_during_run": rebuilt,
        "bench_dir": BENCH_DIR,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": elapsed,
        "summary": s,
        "rounds": {"big": big, "small": small},
        "dyadd_peak_rss_mib": {"after_big": rss_after_big, "end": rss_end},
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
