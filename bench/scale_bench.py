#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How DYAD's metadata path grows with the number of nodes (issue 33): for
N = 4, 16, 64 namespace nodes (scripts/harness.py) on a 3-member etcd
cluster (and on node0's embedded store), every node at once:

- publish: dyad_produce latency (bench/store_wake.c, one process per node,
  SCALE_M files each) and the aggregate files/s;
- lookup: metadata of another node's file without waiting;
- publish-to-wake: node i+1 waits for a file node i then publishes, all
  pairs at once (SCALE_W each);
- consume: every node fetches its ring predecessor's SCALE_M files
  (`dyad consume`): copies/s;
- per dyadd: descriptors, sockets, established TCP connections, RSS; the
  embedded store's host: its CPU seconds;
- etcd's own load from its /metrics: db size, proposals committed, watch
  streams and watchers, CPU seconds of the members.

References in the same run, on the same etcd: etcd's own sequential Put and
Put-to-watch latency (bench/etcd_raw.cpp, the gRPC client dyadd uses, from
node0's namespace) and N such clients putting at once (the aggregate
rate a publish rate compares with).

Results: $BENCH_OUT/scale.json and scale.md, charts scale_*.png (default
build/bench). Knobs: SCALE_NODES (4,16,64), SCALE_STORES (etcd,embedded),
SCALE_M (100), SCALE_W (20), SCALE_ROUNDS (3; rounds interleave the sizes and
the stores, the figures are the medians over rounds)."""
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402

BIN = os.path.join(harness.BUILD, "bin")
WAKE = os.path.join(BIN, "bench_store_wake")
RAW = os.path.join(BIN, "bench_etcd_raw")
OUT = os.environ.get("BENCH_OUT") or os.environ.get("DYAD_BENCH_OUT") or os.path.join(harness.BUILD, "bench")
NODES = [int(x) for x in os.environ.get("SCALE_NODES", "4,16,64").split(",")]
STORES = os.environ.get("SCALE_STORES", "etcd,embedded").split(",")
M = int(os.environ.get("SCALE_M", "100"))
W = int(os.environ.get("SCALE_W", "20"))
ROUNDS = int(os.environ.get("SCALE_ROUNDS", "3"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")


def tool(node, mode, producer):
    env = node.env(producer=producer, consumer=not producer)
    return subprocess.Popen(node.prefix + [WAKE, mode, node.dir], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)


def publish(c):
    """Every node publishes M files at once: (latencies, files/s)."""
    procs = []
    for n in c.nodes:
        os.makedirs(n.path(f"pub{n.index}"), exist_ok=True)
        procs.append(tool(n, "produce", True))
    t0 = time.monotonic()
    for n, p in zip(c.nodes, procs):
        p.stdin.write("".join(f"pub{n.index}/p{k}\n" for k in range(M)))
        p.stdin.flush()
    lat = []
    for p in procs:
        for _ in range(M):
            a, b = p.stdout.readline().split()
            lat.append(float(b) - float(a))
    wall = time.monotonic() - t0
    for p in procs:
        p.stdin.close()
        p.wait()
    return lat, len(c.nodes) * M / wall


def lookups(c):
    """Every node looks up its ring predecessor's M files at once."""
    n = len(c.nodes)
    procs = [tool(node, "lookup", False) for node in c.nodes]
    for i, p in enumerate(procs):
        owner = (i - 1) % n
        p.stdin.write("".join(f"pub{owner}/p{k}\n" for k in range(M)))
        p.stdin.flush()
    lat = []
    for p in procs:
        for _ in range(M):
            a, b, rc = p.stdout.readline().split()
            assert rc == "0", f"lookup failed: rc {rc}"
            lat.append(float(b) - float(a))
    for p in procs:
        p.stdin.close()
        p.wait()
    return lat


def wakes(c):
    """Pairs i -> i+1, all at once: node i+1 waits for a file, node i
    publishes it; seconds from the produce call to the wake."""
    n = len(c.nodes)
    out, lock = [], threading.Lock()

    def pair(i):
        prod, cons = c[i], c[(i + 1) % n]
        os.makedirs(prod.path(f"wake{i}"), exist_ok=True)
        pp, cp = tool(prod, "produce", True), tool(cons, "consume", False)
        mine = []
        for k in range(W):
            name = f"wake{i}/w{k}\n"
            cp.stdin.write(name)
            cp.stdin.flush()
            assert cp.stdout.readline().strip() == "ready"
            time.sleep(0.01)  # the wait reaches the store (the watch) first
            pp.stdin.write(name)
            pp.stdin.flush()
            called, _ = pp.stdout.readline().split()
            mine.append(float(cp.stdout.readline()) - float(called))
        for p in (pp, cp):
            p.stdin.close()
            p.wait()
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=pair, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def sockets_of(pid):
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            except OSError:
                pass
    except OSError:
        pass
    return n


def consume(c):
    """Every node fetches its ring predecessor's M files: (copies/s, the
    most sockets each dyadd held meanwhile, sampled every 0.1 s, the last
    error line of each consume that failed)."""
    n = len(c.nodes)
    peak = {node.name: 0 for node in c.nodes}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for node in c.nodes:
                peak[node.name] = max(peak[node.name], sockets_of(node.service_pid()))
            done.wait(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.monotonic()
    procs = []
    for i, node in enumerate(c.nodes):
        owner = (i - 1) % n
        procs.append(node.dyad_async("consume", *[node.path(f"pub{owner}/p{k}") for k in range(M)]))
    failed = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=600)
            if p.returncode != 0:  # counted and shown, not fatal: a saturated store is a finding
                failed.append(err.strip().splitlines()[-1] if err.strip() else f"rc {p.returncode}")
        return n * M / (time.monotonic() - t0), peak, failed
    finally:
        done.set()
        sampler.join()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_load(c):
    rows = []
    for n in c.nodes:
        pid = n.service_pid()
        fds = os.listdir(f"/proc/{pid}/fd")
        sockets = 0
        for fd in fds:
            try:
                sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            except OSError:
                pass
        ss = subprocess.run(n.prefix + ["ss", "-Htn", "state", "established"], capture_output=True, text=True)
        rows.append({"fds": len(fds), "sockets": sockets, "tcp": len(ss.stdout.splitlines()),
                     "rss_mib": harness.rss_kib(pid) / 1024, "cpu_s": cpu_seconds(pid)})
    return rows


METRICS = {
    "db_bytes": "etcd_mvcc_db_total_size_in_bytes",
    "proposals": "etcd_server_proposals_committed_total",
    "watch_streams": "etcd_debugging_mvcc_watch_stream_total",
    "watchers": "etcd_debugging_mvcc_watcher_total",
    "cpu_s": "process_cpu_seconds_total",
    "rss_bytes": "process_resident_memory_bytes",
}


def etcd_metrics(etcd):
    """Per member: the METRICS values from its /metrics."""
    out = []
    for m in etcd.members:
        text = etcd.metrics(m)
        row = {}
        for k, name in METRICS.items():
            mm = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
            row[k] = float(mm.group(1)) if mm else float("nan")
        out.append(row)
    return out


def raw_reference(c):
    """etcd's own: one client's Put and Put-to-watch latency, and N clients
    (one per node namespace) putting M keys each at once."""
    ep = c.etcd.members[0].endpoint
    n0 = c[0]
    rate = float(subprocess.run(n0.prefix + [RAW, ep, "put-rate", str(M)], capture_output=True, text=True,
                                check=True).stdout)
    watch = [float(x) for x in subprocess.run(n0.prefix + [RAW, ep, "put-to-watch", str(W * 2)],
                                              capture_output=True, text=True, check=True).stdout.split()]
    t0 = time.monotonic()
    procs = [subprocess.Popen(n.prefix + [RAW, c.etcd.members[n.index % 3].endpoint, "put-rate", str(M)],
                              stdout=subprocess.PIPE, text=True) for n in c.nodes]
    for p in procs:
        p.communicate(timeout=600)
    return {"put_s": 1.0 / rate, "put_to_watch": watch,
            "parallel_puts_per_s": len(c.nodes) * M / (time.monotonic() - t0)}


def run(store, n):
    t0 = time.monotonic()
    c = harness.Cluster(nodes=n, netns="require", store=store, etcd_members=3 if store == "etcd" else 1)
    try:
        up = time.monotonic() - t0
        host_cpu0 = cpu_seconds(c[0].service_pid())
        before = etcd_metrics(c.etcd) if c.etcd else None
        pub, rate = publish(c)
        look = lookups(c)
        wake = wakes(c)
        copies, peak, failed = consume(c)
        if failed:
            print(f"scale_bench: {store} N={n}: {len(failed)} of {n} consumes failed, e.g. {failed[0]}", flush=True)
        load = service_load(c)
        for row, node in zip(load, c.nodes):
            row["sockets_peak"] = peak[node.name]
        after = etcd_metrics(c.etcd) if c.etcd else None
        r = {"store": store, "nodes": n, "cluster_up_s": up,
             "publish": pub, "files_per_s": rate, "lookup": look, "wake": wake, "copies_per_s": copies,
             "dyadd": load, "consumes_failed": failed, "store_host_cpu_s": cpu_seconds(c[0].service_pid()) - host_cpu0,
             "publishes": n * (M + W)}
        if c.etcd:
            r["etcd"] = {
                "db_mib": max(a["db_bytes"] for a in after) / 2**20,
                "proposals": max(a["proposals"] for a in after) - max(b["proposals"] for b in before),
                "watch_streams": sum(a["watch_streams"] for a in after),
                "watchers_peak": sum(a["watchers"] for a in after),
                "cpu_s": sum(a["cpu_s"] - b["cpu_s"] for a, b in zip(after, before)),
                "rss_mib": max(a["rss_bytes"] for a in after) / 2**20,
            }
            r["ref"] = raw_reference(c)
        return r
    finally:
        c.cleanup()


def summarize(r):
    ms = 1000.0
    load = r["dyadd"]
    s = {"store": r["store"], "nodes": r["nodes"], "cluster_up_s": r["cluster_up_s"],
         "publish_p50_ms": pct(r["publish"], 50) * ms, "publish_p99_ms": pct(r["publish"], 99) * ms,
         "publish_max_ms": max(r["publish"]) * ms,
         "lookup_p50_ms": pct(r["lookup"], 50) * ms, "lookup_p99_ms": pct(r["lookup"], 99) * ms,
         "wake_p50_ms": pct(r["wake"], 50) * ms, "wake_p99_ms": pct(r["wake"], 99) * ms,
         "files_per_s": r["files_per_s"], "copies_per_s": r["copies_per_s"],
         "fds_median": statistics.median(x["fds"] for x in load), "fds_max": max(x["fds"] for x in load),
         "tcp_median": statistics.median(x["tcp"] for x in load), "tcp_max": max(x["tcp"] for x in load),
         "sockets_peak_median": statistics.median(x["sockets_peak"] for x in load),
         "sockets_peak_max": max(x["sockets_peak"] for x in load),
         "rss_mib_median": statistics.median(x["rss_mib"] for x in load),
         "rss_mib_max": max(x["rss_mib"] for x in load),
         "store_host_cpu_ms_per_publish": r["store_host_cpu_s"] / r["publishes"] * ms,
         "consumes_failed": len(r["consumes_failed"]), "consume_errors": r["consumes_failed"][:3]}
    if "etcd" in r:
        s.update({f"etcd_{k}": v for k, v in r["etcd"].items()})
        s["etcd_cpu_ms_per_publish"] = r["etcd"]["cpu_s"] / r["publishes"] * ms
        ref = r["ref"]
        s["ref_put_ms"] = ref["put_s"] * ms
        s["ref_put_to_watch_p50_ms"] = pct(ref["put_to_watch"], 50) * ms
        s["ref_parallel_puts_per_s"] = ref["parallel_puts_per_s"]
        s["publish_p50_x_put"] = s["publish_p50_ms"] / s["ref_put_ms"]
        s["wake_p50_x_put_to_watch"] = s["wake_p50_ms"] / s["ref_put_to_watch_p50_ms"]
        s["files_per_s_x_parallel_puts"] = s["files_per_s"] / s["ref_parallel_puts_per_s"]
    return s


def markdown(rows):
    cols = [("store", "store", "{}"), ("N", "nodes", "{}"), ("publish p50/p99 ms", None, None),
            ("lookup p50/p99 ms", None, None), ("wake p50/p99 ms", None, None),
            ("publish files/s", "files_per_s", "{:.0f}"), ("copies/s", "copies_per_s", "{:.0f}"),
            ("consumes failed", "consumes_failed", "{:.0f}"),
            ("fds/dyadd med/max", None, None), ("TCP/dyadd idle med/max", None, None), ("sockets/dyadd in consume med/max", None, None),
            ("RSS MiB/dyadd med/max", None, None), ("store CPU ms/publish", None, None),
            ("etcd db MiB", "etcd_db_mib", "{:.1f}"), ("etcd watch streams", "etcd_watch_streams", "{:.0f}"),
            ("x etcd put p50", "publish_p50_x_put", "{:.2f}"),
            ("x etcd put-to-watch p50", "wake_p50_x_put_to_watch", "{:.2f}"),
            ("x N etcd clients' puts/s", "files_per_s_x_parallel_puts", "{:.2f}")]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for s in rows:
        cells = []
        for title, key, fmt in cols:
            if title.startswith("publish p50"):
                cells.append(f"{s['publish_p50_ms']:.2f} / {s['publish_p99_ms']:.1f}")
            elif title.startswith("lookup"):
                cells.append(f"{s['lookup_p50_ms']:.2f} / {s['lookup_p99_ms']:.1f}")
            elif title.startswith("wake"):
                cells.append(f"{s['wake_p50_ms']:.2f} / {s['wake_p99_ms']:.1f}")
            elif title.startswith("fds"):
                cells.append(f"{s['fds_median']:.0f} / {s['fds_max']}")
            elif title.startswith("TCP"):
                cells.append(f"{s['tcp_median']:.0f} / {s['tcp_max']}")
            elif title.startswith("sockets"):
                cells.append(f"{s['sockets_peak_median']:.0f} / {s['sockets_peak_max']}")
            elif title.startswith("RSS"):
                cells.append(f"{s['rss_mib_median']:.0f} / {s['rss_mib_max']:.0f}")
            elif title.startswith("store CPU"):
                v = s.get("etcd_cpu_ms_per_publish", s["store_host_cpu_ms_per_publish"])
                cells.append(f"{v:.2f} ({'etcd' if 'etcd_cpu_ms_per_publish' in s else 'node0'})")
            else:
                v = s.get(key)
                cells.append("-" if v is None else fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plots(rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"scale_bench: no plots ({e})")
        return
    panels = [("latency p50 (ms)", ["publish_p50_ms", "lookup_p50_ms", "wake_p50_ms"]),
              ("latency p99 (ms)", ["publish_p99_ms", "lookup_p99_ms", "wake_p99_ms"]),
              ("files/s", ["files_per_s", "copies_per_s"]),
              ("per dyadd", ["fds_max", "sockets_peak_max", "rss_mib_max"]),
              ("etcd load", ["etcd_cpu_ms_per_publish", "etcd_db_mib", "etcd_watch_streams"])]
    for title, keys in panels:
        fig, ax = plt.subplots(figsize=(6, 4))
        for store in sorted({s["store"] for s in rows}):
            pts = sorted((s["nodes"], s) for s in rows if s["store"] == store)
            for k in keys:
                if k not in pts[0][1]:
                    continue
                ax.plot([p[0] for p in pts], [p[1][k] for p in pts], marker="o", label=f"{store}: {k}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes (N)")
        ax.set_title(f"DYAD at scale: {title} (shared 2-core machine)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")
        fig.savefig(os.path.join(OUT, f"scale_{name}.png"), dpi=100)
        plt.close(fig)


def main():
    reason = harness.netns_unavailable_reason()
    if reason:
        print(f"scale_bench: skipped: {reason}")
        return 0
    os.makedirs(OUT, exist_ok=True)
    raw, rows = [], []
    for rnd in range(ROUNDS):
        sizes = NODES if rnd % 2 == 0 else list(reversed(NODES))
        for n in sizes:
            for store in (STORES if rnd % 2 == 0 else list(reversed(STORES))):
                t0 = time.monotonic()
                r = run(store, n)
                raw.append(r)
                s = summarize(r)
                rows.append(s)
                print(f"scale_bench: {store} N={n}: publish p50 {s['publish_p50_ms']:.2f} ms, "
                      f"wake p50 {s['wake_p50_ms']:.2f} ms, {s['files_per_s']:.0f} files/s "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
    # Rounds: the median of each figure per (store, N).
    merged = []
    for store in STORES:
        for n in NODES:
            mine = [s for s in rows if s["store"] == store and s["nodes"] == n]
            m = dict(mine[0])
            for k, v in mine[0].items():
                if k == "consumes_failed":
                    m[k] = sum(x[k] for x in mine)  # over the rounds
                    m["consume_errors"] = [e for x in mine for e in x["consume_errors"]][:3]
                elif isinstance(v, (int, float)) and k != "nodes":
                    m[k] = statistics.median(x[k] for x in mine)
            merged.append(m)
    with open(os.path.join(OUT, "scale.json"), "w") as f:
        json.dump({"rounds": ROUNDS, "m": M, "w": W, "rows": merged, "runs": rows}, f, indent=1)
    md = markdown(merged)
    with open(os.path.join(OUT, "scale.md"), "w") as f:
        f.write(md)
    print(md)
    plots(merged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
