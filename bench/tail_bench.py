#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The 512 MiB tail (issue 38, item 1): one big file over the stream, many
interleaved rounds, DYAD beside `socat` and bench_plain_copy in the same
run, with evidence of where each round's time went.

Each round writes one new source file of TAIL_MIB MiB (default 512) into
node0's directory (untimed; dyad produce, untimed), then copies it to node1's
directory once per method, in an order rotated from round to round, each
into a new name; every copy is checked (size and a sample of blocks against
the source) and deleted before the next method, the source after the round.

- dyad: `dyad --json consume` on node1 (DYAD_DTL_MODE=FLUX_RPC, the
  stream), between the two dyadd of scripts/harness.py;
- socat: `socat -u OPEN:SRC TCP-LISTEN` on node0's address (listening before
  the timing), timed: `socat -u TCP:... CREATE:DST` bound to node1's;
- plain: bench_plain_copy (bench/plain_copy.c), 1 MiB read()/write() loops.

Only the receiving process is timed, from its start to its exit. Evidence
recorded for every run (printed for the slowest and fastest rounds, all of
it in tail.json): /proc/vmstat deltas (faults, THP, compaction, reclaim,
writeback, dirty throttling), /proc/stat steal and iowait, PSI (cpu, io,
memory) deltas, the receiving process's rusage (CPU, faults, context
switches), both dyadd's /proc/PID/stat deltas, and a sampler thread that
every TAIL_SAMPLE_MS (default 10) reads every thread's state and wchan of
the receiving process, of both dyadd and of the sender, and the TCP queues
of the connection (/proc/net/tcp): where threads waited, off CPU.

Prints p50/p90/max seconds per method and DYAD's ratios to socat's (goal,
issue 38: p90 <= 1.25x, median <= 1.1x). The machine may be shared: the
interleaving makes other load hit every method alike; the run says so.

Environment: TAIL_ROUNDS (20), TAIL_MIB (512), TAIL_WARMUP (1),
TAIL_METHODS (dyad,socat,plain), TAIL_ENV (extra KEY=VAL,... for the
consumer and both dyadd, e.g. to compare a setting), BENCH_DIR (the nodes'
directories; default the system temp dir, on disk). Writes tail.json under
build/bench/ (bench_output.py). Run: make bench (or alone, after make build).
"""
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import bench_output  # noqa: E402
from references import PLAIN_COPY, wait_tcp_listening  # noqa: E402

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
ROUNDS = int(os.environ.get("TAIL_ROUNDS", 2 if QUICK else 20))
WARMUP = int(os.environ.get("TAIL_WARMUP", 0 if QUICK else 1))
SIZE = int(os.environ.get("TAIL_MIB", 64 if QUICK else 512)) << 20
METHODS = os.environ.get("TAIL_METHODS", "dyad,socat,plain").split(",")
SAMPLE_S = float(os.environ.get("TAIL_SAMPLE_MS", 10)) / 1000
EXTRA_ENV = dict(kv.split("=", 1) for kv in os.environ.get("TAIL_ENV", "").split(",") if kv)
BENCH_DIR = os.environ.get("BENCH_DIR") or None
# Nice value of this script, hence of everything it starts (both dyadd, the
# consumers, socat, bench_plain_copy): alike for every method; a negative
# one (root or CAP_SYS_NICE) keeps other users' builds on this shared
# machine from setting the pace. Empty: left as it is.
NICE = os.environ.get("TAIL_NICE", "-10")
GOAL_P90, GOAL_P50 = 1.25, 1.1

VMSTAT_KEYS = ("pgfault", "pgmajfault", "pgalloc_normal", "pgfree", "pgscan_kswapd", "pgscan_direct",
               "pgsteal_kswapd", "pgsteal_direct", "pgrefill", "workingset_refault_file",
               "workingset_refault_anon", "workingset_activate_file", "compact_stall", "compact_fail",
               "compact_success", "compact_migrate_scanned", "compact_free_scanned", "compact_isolated",
               "thp_fault_alloc", "thp_fault_fallback", "thp_collapse_alloc", "thp_split_page",
               "thp_deferred_split_page", "allocstall_normal", "allocstall_movable", "kswapd_low_wmark_hit_quickly",
               "pgpgout", "pgpgin", "nr_dirtied", "nr_written", "pswpout", "balloon_inflate", "balloon_deflate",
               "pgdemote_kswapd", "pgpromote_success", "pgactivate", "pgdeactivate", "pglazyfree",
               "drop_pagecache", "zone_reclaim_failed", "pgmigrate_success", "thp_migration_success")
GAUGES = ("nr_dirty", "nr_writeback", "nr_free_pages", "nr_file_pages", "nr_anon_pages")


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- counters

def read_kv(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if v.strip().lstrip("-").isdigit():
                    out[k] = int(v)
    except OSError:
        pass
    return out


def read_cpu():
    """(steal, iowait, idle) jiffies of all CPUs."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return {"idle": v[3], "iowait": v[4], "steal": v[7] if len(v) > 7 else 0}


def read_psi():
    out = {}
    for what in ("cpu", "io", "memory"):
        try:
            with open(f"/proc/pressure/{what}") as f:
                for line in f:
                    kind = line.split()[0]
                    out[f"{what}_{kind}_us"] = int(line.split("total=")[1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def proc_stat(pid):
    """minflt, majflt, utime, stime (ticks) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    v = s[s.rindex(")") + 2:].split()
    return {"minflt": int(v[7]), "majflt": int(v[9]), "utime": int(v[11]), "stime": int(v[12])}


def thread_switches(pid):
    n = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            st = read_status(f"/proc/{pid}/task/{tid}/status")
            n += st.get("voluntary_ctxt_switches", 0) + st.get("nonvoluntary_ctxt_switches", 0)
    except OSError:
        pass
    return n


def read_status(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(":")
                v = v.strip()
                if v.isdigit():
                    out[k] = int(v)
    except OSError:
        pass
    return out


class Snapshot:
    def __init__(self, daemons):
        self.vm = read_kv("/proc/vmstat")
        self.cpu = read_cpu()
        self.psi = read_psi()
        self.daemons = {k: (proc_stat(p), thread_switches(p)) for k, p in daemons.items()}

    def delta(self, before):
        d = {"vm": {k: self.vm.get(k, 0) - before.vm.get(k, 0) for k in VMSTAT_KEYS if k in self.vm},
             "gauges_before": {k: before.vm.get(k, 0) for k in GAUGES},
             "cpu": {k: self.cpu[k] - before.cpu[k] for k in self.cpu},
             "psi": {k: self.psi[k] - before.psi.get(k, 0) for k in self.psi}, "daemons": {}}
        for k, (st, sw) in self.daemons.items():
            b, bsw = before.daemons[k]
            if st and b:
                d["daemons"][k] = {**{f: st[f] - b[f] for f in st}, "ctxsw": sw - bsw}
        return d


# ---------------------------------------------------------------- sampler

def port_hex(port):
    return "%04X" % port


class Sampler(threading.Thread):
    """Every SAMPLE_S: the state and wchan of every thread of the watched
    processes ({role: pid}; more can be added while it runs), and the TCP
    queues of connections with one end on `port`."""

    def __init__(self, watched, port):
        super().__init__(daemon=True)
        self.watched = dict(watched)
        self.port = port_hex(port) if port else None
        self.states = collections.defaultdict(collections.Counter)  # "role/comm" -> {state:wchan: n}
        self.samples = 0
        self.max_rx = self.max_tx = 0
        self.sum_rx = self.sum_tx = 0
        self.stop_ev = threading.Event()
        self.sched = {}  # (role, tid) -> [comm, first (run_ns, runq_ns), last]

    def watch(self, role, pid):
        self.watched[role] = pid

    def run(self):
        while not self.stop_ev.is_set():
            self.sample()
            self.stop_ev.wait(SAMPLE_S)

    def sample(self):
        self.samples += 1
        for role, pid in list(self.watched.items()):
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        s = f.read()
                    with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                        wchan = f.read().strip() or "-"
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        run_ns, runq_ns = (int(x) for x in f.read().split()[:2])
                except (OSError, ValueError):
                    continue
                comm = s[s.index("(") + 1:s.rindex(")")]
                e = self.sched.setdefault((role, tid), [comm, (run_ns, runq_ns), None])
                e[2] = (run_ns, runq_ns)
                state = s[s.rindex(")") + 2]
                key = "R" if state == "R" else f"{state}:{wchan}"
                self.states[f"{role}/{comm}"][key] += 1
        if self.port:
            rx = tx = 0
            try:
                with open("/proc/net/tcp") as f:
                    next(f)
                    for line in f:
                        p = line.split()
                        if p[1].endswith(":" + self.port) or p[2].endswith(":" + self.port):
                            t, r = p[4].split(":")
                            tx, rx = max(tx, int(t, 16)), max(rx, int(r, 16))
            except (OSError, ValueError, IndexError):
                pass
            self.max_rx, self.max_tx = max(self.max_rx, rx), max(self.max_tx, tx)
            self.sum_rx += rx
            self.sum_tx += tx

    def finish(self):
        self.stop_ev.set()
        self.join()
        # Per role: CPU time and run-queue wait (schedstat) between the first
        # and last sample of each thread; the busiest threads by name.
        sched = collections.defaultdict(lambda: {"run_ms": 0.0, "runq_ms": 0.0, "threads": 0})
        for (role, _), (comm, a, b) in self.sched.items():
            x = sched[f"{role}/{comm}"]
            x["run_ms"] = round(x["run_ms"] + (b[0] - a[0]) / 1e6, 1)
            x["runq_ms"] = round(x["runq_ms"] + (b[1] - a[1]) / 1e6, 1)
            x["threads"] += 1
        return {"samples": self.samples, "sample_ms": SAMPLE_S * 1000, "sched": dict(sched),
                "threads": {k: dict(v.most_common(6)) for k, v in sorted(self.states.items())},
                "tcp": {"max_rx_queue": self.max_rx, "max_tx_queue": self.max_tx,
                        "mean_rx_queue": self.sum_rx // max(1, self.samples),
                        "mean_tx_queue": self.sum_tx // max(1, self.samples)}}


def run_watched(cmd, env, sampler, role):
    """Runs cmd (timed from start to exit) while the sampler watches it:
    (seconds, stdout, rusage dict)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler.watch(role, p.pid)
    out, err = p.communicate(timeout=600)
    wall = time.perf_counter() - t0
    # communicate() reaped it: its rusage is the children's growth
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({p.returncode}): {err.decode(errors='replace')[-2000:]}")
    return wall, out.decode(errors="replace")


def children_usage():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"utime": ru.ru_utime, "stime": ru.ru_stime, "minflt": ru.ru_minflt, "majflt": ru.ru_majflt,
            "nvcsw": ru.ru_nvcsw, "nivcsw": ru.ru_nivcsw}


def usage_delta(a, b):
    return {k: round(b[k] - a[k], 4) if isinstance(b[k], float) else b[k] - a[k] for k in a}


# ---------------------------------------------------------------- methods

def check_copy(src, dst):
    if os.path.getsize(dst) != SIZE:
        raise RuntimeError(f"{dst} has {os.path.getsize(dst)} bytes, expected {SIZE}")
    with open(src, "rb") as a, open(dst, "rb") as b:
        for off in range(0, SIZE, SIZE // 16):
            a.seek(off)
            b.seek(off)
            if a.read(4096) != b.read(4096):
                raise RuntimeError(f"{dst} differs from {src} at offset {off}")


def m_dyad(c, src, rel, sampler):
    cons = c[1]
    dst = cons.path(rel)
    env = cons.env(**{"DYAD_DTL_MODE": "FLUX_RPC", "DYAD_WAIT_TIMEOUT": 60, **EXTRA_ENV})
    wall, out = run_watched([harness.DYAD, "--json", "consume", dst], env, sampler, "consumer")
    info = {}
    try:
        j = json.loads(out.strip().splitlines()[-1])
        f = j["files"][0] if isinstance(j, dict) and j.get("files") else j
        info = {k: f[k] for k in ("transfer_s", "wait_s", "lookup_s", "total_s") if isinstance(f, dict) and k in f}
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    return wall, dst, info


def m_socat(c, src, rel, sampler):
    dst = c[1].path(rel)
    port = harness.free_port(c[0].host)
    server = subprocess.Popen(["socat", "-u", f"OPEN:{src},rdonly",
                               f"TCP-LISTEN:{port},reuseaddr,bind={c[0].host}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_tcp_listening(c[0].host, port, server, "socat")
        sampler.port = port_hex(port)
        sampler.watch("sender", server.pid)
        wall, _ = run_watched(["socat", "-u", f"TCP:{c[0].host}:{port},bind={c[1].host}",
                               f"CREATE:{dst}"], None, sampler, "consumer")
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return wall, dst, {}


def m_plain(c, src, rel, sampler):
    dst = c[1].path(rel)
    server = subprocess.Popen([PLAIN_COPY, "send", c[0].host, src], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        port = server.stdout.readline().strip().decode()
        if not port.isdigit():
            raise RuntimeError(f"bench_plain_copy send printed {port!r} instead of its port")
        sampler.port = port_hex(int(port))
        sampler.watch("sender", server.pid)
        wall, _ = run_watched([PLAIN_COPY, "recv", c[0].host, port, dst, c[1].host], None, sampler,
                              "consumer")
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return wall, dst, {}


METHOD_FNS = {"dyad": m_dyad, "socat": m_socat, "plain": m_plain}


def measure(c, method, src, rel):
    daemons = {"dyadd0": c[0].proc.pid, "dyadd1": c[1].proc.pid}
    sampler = Sampler({"dyadd0": daemons["dyadd0"], "dyadd1": daemons["dyadd1"]},
                      c[0].port if method == "dyad" else None)
    ru0 = children_usage()
    before = Snapshot(daemons)
    sampler.start()
    try:
        wall, dst, info = METHOD_FNS[method](c, src, rel, sampler)
    finally:
        ev = sampler.finish()
    d = Snapshot(daemons).delta(before)
    d["consumer_rusage"] = usage_delta(ru0, children_usage())
    d["sampled"] = ev
    check_copy(src, dst)
    os.unlink(dst)
    return {"method": method, "s": wall, **info, **d}


# ---------------------------------------------------------------- report

def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(runs):
    out = {}
    for m in METHODS:
        xs = [r["s"] for r in runs if r["method"] == m]
        out[m] = {"n": len(xs), "p50": pct(xs, 0.5), "p90": pct(xs, 0.9), "max": max(xs), "min": min(xs)}
    return out


def brief(r):
    vm, ru = r["vm"], r["consumer_rusage"]
    keys = ("pgfault", "pgmajfault", "pgscan_kswapd", "pgscan_direct", "pgsteal_kswapd", "compact_stall",
            "thp_fault_alloc", "workingset_refault_file", "allocstall_normal", "pgpgout", "nr_written")
    vms = " ".join(f"{k}={vm.get(k, 0)}" for k in keys if vm.get(k, 0))
    top = []
    for th, st in r["sampled"]["threads"].items():
        if not th.startswith(("consumer", "sender")) and r["method"] != "dyad":
            continue
        sc = r["sampled"].get("sched", {}).get(th, {})
        if st:
            top.append(f"{th} x{sc.get('threads', 0)} run {sc.get('run_ms', 0):.0f} ms runq {sc.get('runq_ms', 0):.0f} ms: "
                       + ", ".join(f"{k} {v}" for k, v in sorted(st.items(), key=lambda kv: -kv[1])[:3]))
    return (f"  {r['method']:5s} r{r['round']:02d}#{r['position']} {r['s']:.3f} s"
            + (f" (transfer {r['transfer_s']:.3f})" if "transfer_s" in r else "")
            + f"  steal={r['cpu']['steal']} iowait={r['cpu']['iowait']} io_some={r['psi'].get('io_some_us', 0) // 1000}ms"
            f" mem_some={r['psi'].get('memory_some_us', 0) // 1000}ms cpu_some={r['psi'].get('cpu_some_us', 0) // 1000}ms"
            f"  dirty0={r['gauges_before']['nr_dirty'] * 4 // 1024}MiB"
            f"\n        consumer: utime={ru['utime']:.3f} stime={ru['stime']:.3f} minflt={ru['minflt']} "
            f"majflt={ru['majflt']} vcsw={ru['nvcsw']} ivcsw={ru['nivcsw']}  tcp max rx/tx "
            f"{r['sampled']['tcp']['max_rx_queue']}/{r['sampled']['tcp']['max_tx_queue']}"
            f"\n        vm: {vms}\n        " + "\n        ".join(top))


def main():
    missing = [t for t in ("socat",) if t in METHODS and not shutil.which(t)]
    if "plain" in METHODS and not os.access(PLAIN_COPY, os.X_OK):
        missing.append("bench_plain_copy (make build)")
    if missing:
        log(f"tail_bench: missing {', '.join(missing)}")
        return 1
    root = tempfile.mkdtemp(prefix="dyad-tail-", dir=BENCH_DIR) if BENCH_DIR else None
    nice = "unchanged"
    if NICE:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, int(NICE))
            nice = NICE
        except OSError as e:
            nice = f"unchanged ({e.strerror}: TAIL_NICE={NICE} needs root or CAP_SYS_NICE)"
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[:3]
    log(f"tail_bench: {ROUNDS} rounds (+{WARMUP} warm-up) of {SIZE >> 20} MiB, methods {', '.join(METHODS)}"
        f"{', env ' + str(EXTRA_ENV) if EXTRA_ENV else ''}; nice {nice}; load average {' '.join(load0)} "
        "(the machine is shared: other engineers' builds and tests run beside this)")
    runs = []
    with harness.Cluster(nodes=2, root=root, env=EXTRA_ENV or None) as c:
        for rnd in range(WARMUP + ROUNDS):
            tag = f"{os.getpid()}-{rnd}"
            rel_src = f"tail-src-{tag}.bin"
            src = c[0].path(rel_src)
            harness.write_file(src, SIZE, seed=rnd)
            c[0].dyad("produce", src)
            order = METHODS[rnd % len(METHODS):] + METHODS[:rnd % len(METHODS)]
            for pos, m in enumerate(order):
                rel = rel_src if m == "dyad" else f"tail-{m}-{tag}.bin"
                r = measure(c, m, src, rel)
                r.update(round=rnd - WARMUP, position=pos)
                if rnd >= WARMUP:
                    runs.append(r)
                log(f"round {rnd - WARMUP:2d} {m:5s} {r['s']:.3f} s"
                    + (f" (transfer {r['transfer_s']:.3f} s)" if "transfer_s" in r else "")
                    + f" pgscan={r['vm'].get('pgscan_kswapd', 0) + r['vm'].get('pgscan_direct', 0)}"
                    f" steal={r['cpu']['steal']} minflt={r['consumer_rusage']['minflt']}")
            os.unlink(src)
    s = summary(runs)
    log(f"\n{SIZE >> 20} MiB, {ROUNDS} rounds: seconds (receiving process, start to exit)")
    log(f"  {'method':6s} {'p50':>7s} {'p90':>7s} {'max':>7s} {'min':>7s}")
    for m in METHODS:
        log(f"  {m:6s} {s[m]['p50']:7.3f} {s[m]['p90']:7.3f} {s[m]['max']:7.3f} {s[m]['min']:7.3f}")
    ratios = {}
    if "dyad" in s and "socat" in s:
        ratios = {"p50": s["dyad"]["p50"] / s["socat"]["p50"], "p90": s["dyad"]["p90"] / s["socat"]["p90"],
                  "max": s["dyad"]["max"] / s["socat"]["max"]}
        log(f"  DYAD / socat: p50 {ratios['p50']:.2f}x (goal <= {GOAL_P50}), p90 {ratios['p90']:.2f}x "
            f"(goal <= {GOAL_P90}), max {ratios['max']:.2f}x")
    if "dyad" in s and "plain" in s:
        log(f"  DYAD / plain: p50 {s['dyad']['p50'] / s['plain']['p50']:.2f}x, "
            f"p90 {s['dyad']['p90'] / s['plain']['p90']:.2f}x")
    for m in METHODS:
        rs = sorted((r for r in runs if r["method"] == m), key=lambda r: r["s"])
        if not rs:
            continue
        log(f"\n{m}: slowest rounds, then the fastest")
        for r in rs[-3:][::-1] + rs[:1]:
            log(brief(r))
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[:3]
    log(f"\nload average at the end {' '.join(load1)} (shared machine)")
    path = bench_output.save("tail", {"size": SIZE, "rounds": ROUNDS, "env": EXTRA_ENV, "nice": nice, "summary": s,
                                      "ratios_to_socat": ratios, "load": [load0, load1], "runs": runs})
    log(f"tail_bench: results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
