#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The metadata store, side by side in one run (issue 16): for the embedded
store and for etcd (dyadd --kvs etcd://), publish rate, lookup latency and
publish-to-wake latency through the C API (bench/store_wake.c), beside
etcd's own figures on the same etcd: sequential Puts and Put-to-watch with
the gRPC client dyadd uses (bench/etcd_raw.cpp), and etcdctl put / etcdctl
watch (a process per put, what a script would use). Then `dyad ls` of many
records on etcd, with the dyadd's RSS growth.

Results: $DYAD_BENCH_OUT/store.json (default build/bench). Knobs: STORE_N
(publishes and waits per round, default 300), STORE_ROUNDS (3),
STORE_LS_RECORDS (records for the listing row, default 1000000)."""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402

BIN = os.path.join(harness.BUILD, "bin")
WAKE = os.path.join(BIN, "bench_store_wake")
RAW = os.path.join(BIN, "bench_etcd_raw")
OUT = os.environ.get("DYAD_BENCH_OUT", os.path.join(harness.BUILD, "bench"))
N = int(os.environ.get("STORE_N", "300"))
ROUNDS = int(os.environ.get("STORE_ROUNDS", "3"))
LS_RECORDS = int(os.environ.get("STORE_LS_RECORDS", "1000000"))
BATCH_N = int(os.environ.get("STORE_BATCH_N", str(4 * N)))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def proc(node, mode, producer):
    env = node.env(producer=producer, consumer=not producer)
    return subprocess.Popen(node.prefix + [WAKE, mode, node.dir], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)


def ask(p, line):
    p.stdin.write(line + "\n")
    p.stdin.flush()


def write_files(node, names):
    for n in names:
        with open(node.path(n), "w") as fh:
            fh.write("0123456789abcdef" * 4)


def publish_rate(node, tag, write=False):
    """dyad_produce in a loop, one at a time. write: each file written
    just before its publish, inside the timing (what the row measured before
    issue 33: on this machine's ext4 /tmp the file's creation cost as much
    as the publish); else the files are written first and only the
    publishes are timed."""
    p = proc(node, "produce" if write else "publish", True)
    os.makedirs(node.path(tag), exist_ok=True)
    if not write:
        write_files(node, [f"{tag}/p{i}" for i in range(N)])
    t0 = time.monotonic()
    for i in range(N):
        ask(p, f"{tag}/p{i}")
    for i in range(N):
        p.stdout.readline()
    rate = N / (time.monotonic() - t0)
    p.stdin.close()
    p.wait()
    return rate


def batch_rate(node, tag):
    """`dyad produce` of BATCH_N files written before (one command: its
    publishes in flight together, the service batching their records)."""
    os.makedirs(node.path(tag), exist_ok=True)
    names = [f"{tag}/q{i}" for i in range(BATCH_N)]
    write_files(node, names)
    t0 = time.monotonic()
    subprocess.run(node.prefix + [harness.DYAD, "produce", *[node.path(n) for n in names]],
                   env=node.env(producer=True, consumer=False), check=True, stdout=subprocess.DEVNULL)
    return BATCH_N / (time.monotonic() - t0)


def lookups(node, tag):
    p = proc(node, "lookup", False)
    lat = []
    for i in range(N):
        ask(p, f"{tag}/p{i}")
        t0, t1, rc = p.stdout.readline().split()
        assert rc == "0", f"lookup of {tag}/p{i}: rc {rc}"
        lat.append(float(t1) - float(t0))
    p.stdin.close()
    p.wait()
    return lat


def wakes(prod, cons, tag):
    """Seconds from the call of dyad_produce to the waiting consumer's wake
    (from the return, the wake often comes first: the watch event reaches the
    consumer's service before the put's answer reaches the producer's)."""
    os.makedirs(prod.path(tag), exist_ok=True)
    pp, cp = proc(prod, "produce", True), proc(cons, "consume", False)
    out = []
    for i in range(N):
        name = f"{tag}/w{i}"
        ask(cp, name)
        assert cp.stdout.readline().strip() == "ready"
        time.sleep(0.01)  # the wait reaches the store (the watch) first
        ask(pp, name)
        called, _ = pp.stdout.readline().split()
        woke = float(cp.stdout.readline())
        out.append(woke - float(called))
    for p in (pp, cp):
        p.stdin.close()
        p.wait()
    return out


def etcdctl_rates(etcd):
    n = max(20, N // 10)
    t0 = time.monotonic()
    for i in range(n):
        etcd.ctl("put", f"/bench/ctl/{i}", "x" * 300)
    rate = n / (time.monotonic() - t0)
    # put -> watch: the watch prints the key when the event arrives.
    w = subprocess.Popen(etcd.prefix + [harness.ETCDCTL, "--endpoints", etcd.endpoint, "watch", "--prefix",
                                        "/bench/ctlw/"], stdout=subprocess.PIPE, text=True, bufsize=1,
                         env=dict(os.environ, ETCDCTL_API="3"))
    time.sleep(0.5)
    lat = []
    for i in range(n):
        t1 = time.monotonic()
        etcd.ctl("put", f"/bench/ctlw/{i}", "x")
        while True:  # PUT / key / value lines
            line = w.stdout.readline()
            if line.strip() == f"/bench/ctlw/{i}":
                break
        lat.append(time.monotonic() - t1)
        w.stdout.readline()
    w.terminate()
    w.wait()
    return rate, lat


def raw(etcd, *args):
    return subprocess.run(etcd.prefix + [RAW, etcd.endpoint, *args], capture_output=True, text=True, check=True).stdout


def ls_row(etcd, node):
    """LS_RECORDS records put straight into etcd (as a service would), then
    `dyad ls --json` of all of them through the node's service."""
    value = json.dumps({"path": "ls/part.dat", "owner": "bench", "node": "bench", "endpoints": ["tcp://127.0.0.1:9"],
                        "producer_dir": "/scratch/bench", "size": 4096, "mtime_ns": 1718000000000000000,
                        "mode": 420, "ino": 1000})
    raw(etcd, "fill", str(LS_RECORDS), "/dyad/ns/dyad/files/ls/", value)
    before = harness.rss_kib(node.proc.pid)
    t0 = time.monotonic()
    p = subprocess.Popen(node.prefix + [harness.DYAD, "--json", "ls", "ls/"], env=node.env(producer=False),
                         stdout=subprocess.PIPE, text=True)
    count, peak = 0, before
    for _ in p.stdout:
        count += 1
        if count % 50000 == 0:
            peak = max(peak, harness.rss_kib(node.proc.pid))
    p.wait()
    secs = time.monotonic() - t0
    peak = max(peak, harness.rss_kib(node.proc.pid))
    return {"records": LS_RECORDS, "listed": count, "seconds": secs, "rss_growth_mib": (peak - before) / 1024}


def main():
    os.makedirs(OUT, exist_ok=True)
    etcd = harness.Etcd()
    emb = harness.Cluster(nodes=2)
    ext = harness.Cluster(nodes=2, kvs=etcd.uri)
    res = {"n": N, "rounds": ROUNDS, "embedded": {}, "etcd": {}, "reference": {}}
    try:
        acc = {k: {"rate": [], "write_rate": [], "batch_rate": [], "lookup": [], "wake": []}
               for k in ("embedded", "etcd")}
        ref = {"raw_rate": [], "raw_watch": [], "raw_watch_idle": [], "raw_get": [], "ctl_rate": [],
               "ctl_watch": []}
        for r in range(ROUNDS):  # interleaved rounds
            for name, c in (("embedded", emb), ("etcd", ext)):
                tag = f"b{r}"
                acc[name]["rate"].append(publish_rate(c[0], tag))
                acc[name]["write_rate"].append(publish_rate(c[0], tag + "w", write=True))
                acc[name]["batch_rate"].append(batch_rate(c[0], tag + "q"))
                acc[name]["lookup"] += lookups(c[1], tag)
                acc[name]["wake"] += wakes(c[0], c[1], tag)
            ref["raw_rate"].append(float(raw(etcd, "put-rate", str(N))))
            ref["raw_watch"] += [float(x) for x in raw(etcd, "put-to-watch", str(N)).split()]
            # As the wake row runs: each put after 10 ms idle.
            ref["raw_watch_idle"] += [float(x) for x in raw(etcd, "put-to-watch", str(N), "0.01").split()]
            ref["raw_get"] += [float(x) for x in raw(etcd, "get", str(N)).split()]
            rate, lat = etcdctl_rates(etcd)
            ref["ctl_rate"].append(rate)
            ref["ctl_watch"] += lat
        for name in acc:
            a = acc[name]
            res[name] = {"publish_per_s": statistics.median(a["rate"]),
                         "write_publish_per_s": statistics.median(a["write_rate"]),
                         "batch_publish_per_s": statistics.median(a["batch_rate"]),
                         "lookup_p50_ms": pct(a["lookup"], 50) * 1e3, "lookup_p99_ms": pct(a["lookup"], 99) * 1e3,
                         "wake_p50_ms": pct(a["wake"], 50) * 1e3, "wake_p99_ms": pct(a["wake"], 99) * 1e3}
        res["reference"] = {"etcd_put_per_s": statistics.median(ref["raw_rate"]),
                            "etcd_put_to_watch_p50_ms": pct(ref["raw_watch"], 50) * 1e3,
                            "etcd_put_to_watch_p99_ms": pct(ref["raw_watch"], 99) * 1e3,
                            "etcd_put_to_watch_idle_p50_ms": pct(ref["raw_watch_idle"], 50) * 1e3,
                            "etcd_put_to_watch_idle_p99_ms": pct(ref["raw_watch_idle"], 99) * 1e3,
                            "etcd_get_p50_ms": pct(ref["raw_get"], 50) * 1e3,
                            "etcd_get_p99_ms": pct(ref["raw_get"], 99) * 1e3,
                            "etcdctl_put_per_s": statistics.median(ref["ctl_rate"]),
                            "etcdctl_put_to_watch_p50_ms": pct(ref["ctl_watch"], 50) * 1e3,
                            "etcdctl_put_to_watch_p99_ms": pct(ref["ctl_watch"], 99) * 1e3}
        if LS_RECORDS:
            res["etcd_ls"] = ls_row(etcd, ext[0])
    finally:
        emb.cleanup()
        ext.cleanup()
        etcd.cleanup()
    e, x, f = res["embedded"], res["etcd"], res["reference"]
    print(f"metadata store, {ROUNDS} interleaved rounds of {N} (medians; latencies p50 / p99)")
    print(f"{'row':34} {'embedded':>18} {'etcd backend':>18} {'etcd raw gRPC':>18} {'etcdctl':>18}  ratio")
    print(f"{'publish rate (/s)':34} {e['publish_per_s']:18.0f} {x['publish_per_s']:18.0f} "
          f"{f['etcd_put_per_s']:18.0f} {f['etcdctl_put_per_s']:18.0f}  "
          f"{x['publish_per_s'] / f['etcd_put_per_s']:.2f}x raw put")
    print(f"{'write + publish rate (/s)':34} {e['write_publish_per_s']:18.0f} {x['write_publish_per_s']:18.0f} "
          f"{f['etcd_put_per_s']:18.0f} {'':18}  {x['write_publish_per_s'] / f['etcd_put_per_s']:.2f}x raw put")
    print(f"{'dyad produce of ' + str(BATCH_N) + ' files (/s)':34} {e['batch_publish_per_s']:18.0f} "
          f"{x['batch_publish_per_s']:18.0f} {f['etcd_put_per_s']:18.0f} {'':18}  "
          f"{x['batch_publish_per_s'] / f['etcd_put_per_s']:.2f}x raw put")
    print(f"{'lookup (ms)':34} {e['lookup_p50_ms']:8.3f} / {e['lookup_p99_ms']:7.3f} "
          f"{x['lookup_p50_ms']:8.3f} / {x['lookup_p99_ms']:7.3f} "
          f"{f['etcd_get_p50_ms']:8.3f} / {f['etcd_get_p99_ms']:7.3f} {'':18}  "
          f"{x['lookup_p50_ms'] / f['etcd_get_p50_ms']:.2f}x raw serializable get (p50)")
    print(f"{'publish-to-wake (ms)':34} {e['wake_p50_ms']:8.3f} / {e['wake_p99_ms']:7.3f} "
          f"{x['wake_p50_ms']:8.3f} / {x['wake_p99_ms']:7.3f} "
          f"{f['etcd_put_to_watch_p50_ms']:8.3f} / {f['etcd_put_to_watch_p99_ms']:7.3f} "
          f"{f['etcdctl_put_to_watch_p50_ms']:8.3f} / {f['etcdctl_put_to_watch_p99_ms']:7.3f}  "
          f"{x['wake_p50_ms'] / f['etcd_put_to_watch_p50_ms']:.2f}x raw put-to-watch (p50)")
    print(f"{'  raw, each put after 10 ms idle':34} {'':18} {'':18} "
          f"{f['etcd_put_to_watch_idle_p50_ms']:8.3f} / {f['etcd_put_to_watch_idle_p99_ms']:7.3f} {'':18}  "
          f"{x['wake_p50_ms'] / f['etcd_put_to_watch_idle_p50_ms']:.2f}x (p50, as the wake row runs)")
    if "etcd_ls" in res:
        ls = res["etcd_ls"]
        print(f"dyad ls of {ls['records']} etcd records: {ls['listed']} listed in {ls['seconds']:.1f} s, "
              f"dyadd RSS growth {ls['rss_growth_mib']:.1f} MiB")
    with open(os.path.join(OUT, "store.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
