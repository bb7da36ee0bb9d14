# SPDX-License-Identifier: Apache-2.0
"""Where a DYAD MD frame stream spends its time, per frame (issue 49's
stream goals): one bench/outside stream run of DYAD (node 0 to node 1, as
`make bench-outside` runs it) with every process of it measured, as root.
The same for ADIOS2 (--method adios2-sst or adios2-bp5, ADIOS2_DIR set):
its writer and reader take the producer's and consumer's places.

    DYAD_BUILD_DIR=build python3 bench/outside/profile_stream.py [--method pydyad]
        [--size 644KiB] [--frames 64] [--out DIR]

Two runs of the same stream:
  1. CPU: `perf stat -e task-clock,context-switches,cpu-migrations` around
     the producer and the consumer, /proc/PID/stat CPU time of both dyadds
     over the run; per frame (CPU ms / frame) beside the run's wall time per
     frame.
  2. Syscalls: `strace -c -f` around the producer and the consumer and
     attached to both dyadds (strace slows every call: its run's rates are
     not figures, its call counts per frame are).
  3. Samples: `perf record` around the producer and the consumer and
     attached to the serving dyadd: the share of each one's CPU by DSO
     (the Python interpreter, libdyad, libc, the kernel's copies...).
Prints a summary and writes DIR/profile-<method>-<size>.txt with the raw
perf and strace tables.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside as ox  # noqa: E402

wf = ox.wf
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


class Wrapped:
    """env.spawn with the producer's and consumer's command wrapped."""

    def __init__(self, env, wrap):
        self.env, self.wrap, self.files = env, wrap, {}
        self.orig = env.spawn

    def __enter__(self):
        def spawn(node, cmd, e, log):
            side = "consumer" if "consume" in cmd or "read" in cmd else "producer"
            path = os.path.join(self.env.cluster.root, f"{side}.{self.wrap[0]}")
            self.files[side] = path
            return self.orig(node, self.wrap[1](path) + cmd, e, log)
        self.env.spawn = spawn
        return self

    def __exit__(self, *exc):
        self.env.spawn = self.orig


def perf(path):
    return ["perf", "stat", "-e", "task-clock,context-switches,cpu-migrations", "-x", ",", "-o", path, "--"]


def record(path):
    return ["perf", "record", "-q", "-F", "2000", "-o", path, "--"]


def shares(path, sort, n=7):
    """perf report's top rows by `sort` (dso or sym): "name share, ..."."""
    p = subprocess.run(["perf", "report", "-i", path, "--stdio", "--sort", sort, "-q"], capture_output=True,
                       text=True)
    rows = [line.split(None, 1) for line in p.stdout.splitlines()]
    rows = [(r[0], r[1].strip().replace("[k] ", "").replace("[.] ", "")) for r in rows
            if len(r) == 2 and r[0].endswith("%")]
    return ", ".join(f"{name} {share}" for share, name in rows[:n]) or p.stderr.strip()[-200:]


def strace(path):
    return ["strace", "-c", "-f", "-o", path]


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return f"({e})"


def task_clock_ms(text):
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("task-clock"):
            return float(parts[0])
    return None


def top_calls(text, n=8):
    """The strace -c table's busiest rows: (calls, name, seconds)."""
    rows = []
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 5 and p[0].replace(".", "").isdigit() and p[-1] != "total":
            try:
                calls = int(p[3])
            except ValueError:
                continue
            rows.append((calls, p[-1], float(p[1])))
    return sorted(rows, reverse=True)[:n]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="pydyad")
    p.add_argument("--size", default="644KiB", choices=list(wf.FRAME_SIZES))
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--out", default=os.path.join(os.environ.get("BENCH_OUT", os.path.join(wf.ROOT, "build", "bench")),
                                                 "outside"))
    a = p.parse_args()
    reason = wf.unavailable_reason()
    if reason:
        sys.exit(f"profile_stream: cannot run here: {reason}")
    os.makedirs(a.out, exist_ok=True)
    size = wf.FRAME_SIZES[a.size]
    if a.method.startswith("adios2"):
        why = ox.adios2_unavailable(os.environ.get("ADIOS2_DIR"))
        if why:
            sys.exit(f"profile_stream: {why}")
        exe = ox.build_adios2_driver(os.environ["ADIOS2_DIR"], a.out)
        engine = a.method.split("-")[1].upper()

        def run(env, n):
            return ox.run_adios2_frames(env, exe, engine, size, n)
    else:
        def run(env, n):
            return ox.run_dyad_frames(env, a.method, size, n)
    report = [f"profile_stream: {a.method}, {a.frames} frames of {a.size}, node 0 -> node 1, load "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"]
    raw = []
    with wf.Env(2, gfs=a.method == "adios2-bp5") as env:
        run(env, 8)  # warm-up
        pids = [n.service_pid() for n in env.nodes]
        before = [cpu_seconds(x) for x in pids]
        with Wrapped(env, ("perf", perf)) as w:
            res = run(env, a.frames)
        after = [cpu_seconds(x) for x in pids]
        texts = {s: read(f) for s, f in w.files.items()}
        wall = res["e2e_wall"]
        report.append(f"run 1 (perf stat): {res['steady_fps']:.1f} frames/s steady, {res['frames_per_s']:.1f} end "
                      f"to end; wall {wall * 1e3 / a.frames:.2f} ms/frame end to end, gap p50 "
                      f"{ox_pct(res['gaps'], .5) * 1e3:.2f} ms")
        for side in ("producer", "consumer"):
            ms = task_clock_ms(texts.get(side, ""))
            report.append(f"  {side}: CPU {ms:.0f} ms in all, {ms / a.frames:.2f} ms/frame (process start-up in)"
                          if ms else f"  {side}: no perf figure")
            raw.append(f"== perf stat, {side}\n{texts.get(side)}")
        for k, (b, e) in enumerate(zip(before, after)):
            report.append(f"  dyadd of node {k}: CPU {(e - b) * 1e3:.0f} ms, {(e - b) * 1e3 / a.frames:.2f} ms/frame")
        traces = [os.path.join(env.cluster.root, f"dyadd{k}.strace") for k in range(2)]
        attached = [subprocess.Popen(["strace", "-c", "-f", "-p", str(x), "-o", t], stderr=subprocess.DEVNULL)
                    for x, t in zip(pids, traces)]
        time.sleep(1.0)  # strace attached to every thread
        with Wrapped(env, ("strace", strace)) as w:
            res2 = run(env, a.frames)
        for s in attached:
            s.terminate()
            s.wait(timeout=30)
        report.append(f"run 2 (strace -c, slowed): {res2['steady_fps']:.1f} frames/s steady; syscalls per frame:")
        named = [(side, read(f)) for side, f in w.files.items()] + [(f"dyadd of node {k}", read(t))
                                                                     for k, t in enumerate(traces)]
        for side, text in named:
            raw.append(f"== strace -c -f, {side}\n{text}")
            top = ", ".join(f"{name} {calls / a.frames:.1f} ({sec * 1e3 / a.frames:.2f} ms)"
                            for calls, name, sec in top_calls(text))
            report.append(f"  {side}: {top}")
        rec = os.path.join(env.cluster.root, "dyadd0.perf")
        attached = subprocess.Popen(["perf", "record", "-q", "-F", "2000", "-p", str(pids[0]), "-o", rec],
                                    stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        with Wrapped(env, ("perf.data", record)) as w:
            res3 = run(env, a.frames)
        attached.send_signal(2)
        attached.wait(timeout=60)
        report.append(f"run 3 (perf record): {res3['steady_fps']:.1f} frames/s steady; CPU samples by DSO:")
        for side, f in list(w.files.items()) + [("dyadd of node 0", rec)]:
            report.append(f"  {side}: {shares(f, 'dso')}")
            report.append(f"    top symbols: {shares(f, 'sym', 10)}")
    text = "\n".join(report)
    print(text)
    with open(os.path.join(a.out, f"profile-{a.method}-{a.size}.txt"), "w") as f:
        f.write(re.sub(r"\S*/dyad-cluster-\w+", "<cluster>", text + "\n\n" + "\n".join(raw)))


def ox_pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else 0.0


if __name__ == "__main__":
    main()
