#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`dyad ls` of a large namespace in the embedded store (not part of
`make bench`; run it alone after a build).

Starts one dyadd (scripts/harness.py, with a job key), puts N records
(default 1,000,000; BENCH_RECORDS=N) into its store directly with `kvs.put`
as a service would (pipelined on one connection, the raw wire protocol of
tests/integration/rawwire.py: producing a million real files would time the
file system, not the listing), then times `dyad ls` and `dyad --json ls`
of the whole namespace and reports:

- the wall time of each listing and the lines it printed (must be N);
- the dyadd's resident memory before the listing and its peak during it
  (sampled every 20 ms from /proc), i.e. the growth a listing causes;
- the peak resident memory of the `dyad ls` process (getrusage).

Goal (issue 16): 1,000,000 records list completely in under 10 s with dyadd
RSS growth under 100 MB. Prints one JSON object with the figures.
"""
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402
import rawwire  # noqa: E402

RECORDS = int(os.environ.get("BENCH_RECORDS", 1000000))
WINDOW = 2000  # requests in flight on the put connection


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cpu_s(pid):
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def put_records(node, n):
    """n records owned by service 'bench', pipelined WINDOW at a time."""
    raw = rawwire.Raw.to(node, role="service", service_id="bench", timeout=120)
    t0 = time.monotonic()
    sent = 0
    while sent < n:
        batch = range(sent, min(n, sent + WINDOW))
        frames = []
        for i in batch:
            path = f"run{i % 100:02d}/part{i:07d}.dat"
            value = json.dumps({"path": path, "owner": "bench", "node": "bench", "endpoints": ["tcp://127.0.0.1:9"],
                                "producer_dir": "/scratch/bench", "size": 4096 + i, "mtime_ns": 1718000000000000000 + i,
                                "mode": 420, "ino": 1000 + i})
            key = f"{(i * 2654435761) % 1024:x}.{(i * 40503) % 1024:x}.{i % 1024:x}.{path}"
            meta = json.dumps({"topic": "kvs.put", "ns": "dyad", "key": key, "value": value}).encode()
            frames.append(raw.frame(rawwire.REQUEST, i + 1, meta))
        raw.s.sendall(b"".join(frames))
        for _ in batch:
            f = raw.recv()
            if f["type"] != rawwire.END:
                raise RuntimeError(f"kvs.put refused: {f['meta']}")
        sent += len(batch)
        if sent % 100000 == 0:
            log(f"  {sent} records put ({sent / (time.monotonic() - t0):.0f}/s)")
    raw.close()
    return time.monotonic() - t0


def timed_ls(node, pid, *args):
    """Runs dyad ls; returns (seconds, lines, dyadd RSS before and peak KiB, ls max RSS KiB)."""
    before = harness.rss_kib(pid)
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], harness.rss_kib(pid))
            done.wait(0.02)  # the sampling period

    th = threading.Thread(target=sample)
    th.start()
    cpu0 = cpu_s(pid)
    t0 = time.monotonic()
    p = subprocess.Popen([harness.DYAD, *args, "ls"], env=node.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    lines = 0
    while True:
        chunk = p.stdout.read(1 << 20)
        if not chunk:
            break
        lines += chunk.count(b"\n")
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    dt = time.monotonic() - t0
    dyadd_cpu = cpu_s(pid) - cpu0
    done.set()
    th.join()
    if p.returncode != 0:
        raise RuntimeError(f"dyad ls failed ({p.returncode}): {err.decode()}")
    return dt, lines, before, peak[0], usage.ru_maxrss, dyadd_cpu, usage.ru_utime + usage.ru_stime


def main():
    with harness.Cluster(nodes=1, start=False) as c:
        node = c[0]
        node.start(["--store-max-records-per-namespace", str(max(RECORDS + 10, 1000000)), "--store-max", "4G"])
        pid = node.proc.pid
        start_rss = harness.rss_kib(pid)
        log(f"putting {RECORDS} records into the embedded store of dyadd (pid {pid})")
        put_s = put_records(node, RECORDS)
        st = node.status()["store"]
        out = {"records": RECORDS, "put_s": round(put_s, 1), "put_per_s": round(RECORDS / put_s),
               "dyadd_rss_start_mib": round(start_rss / 1024, 1),
               "store_keys": st["keys"], "store_bytes_mib": round(st["bytes"] / 2**20, 1)}
        for name, args in (("ls", ()), ("ls_json", ("--json",))):
            dt, lines, before, peak, ls_rss, dyadd_cpu, ls_cpu = timed_ls(node, pid, *args)
            if lines != RECORDS:
                raise RuntimeError(f"dyad {' '.join(args)} ls printed {lines} lines, not {RECORDS}")
            out[name] = {"seconds": round(dt, 2), "lines": lines, "records_per_s": round(lines / dt),
                         "dyadd_rss_before_mib": round(before / 1024, 1),
                         "dyadd_rss_growth_mib": round((peak - before) / 1024, 1),
                         "dyad_ls_max_rss_mib": round(ls_rss / 1024, 1),
                         "dyadd_cpu_s": round(dyadd_cpu, 2), "dyad_ls_cpu_s": round(ls_cpu, 2)}
            log(f"dyad {' '.join(args)} ls: {lines} lines in {dt:.2f} s; dyadd RSS {before / 1024:.0f} MiB, "
                f"+{(peak - before) / 1024:.1f} MiB during the listing; dyad ls peak RSS {ls_rss / 1024:.1f} MiB; "
                f"CPU dyadd {dyadd_cpu:.2f} s, dyad ls {ls_cpu:.2f} s")
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
