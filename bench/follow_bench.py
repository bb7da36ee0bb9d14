#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`dyad sync --follow` on etcd (issue 33): the cost of a follow pass that
finds 10 new records, in namespaces of FOLLOW_SMALL and FOLLOW_LARGE records
(default 10,000 and 100,000; 1,000,000 takes minutes to fill), side by side
with the pass it replaces (one listing of the namespace: `dyad sync` of the
same prefix, which lists and consumes the same 10 files).

A row: a `dyad sync --follow --count 10 new/` is started and waits, past its
first listing, on kvs.changes (the service's status counts its requests);
then 10 files are produced at once and the time from the produce's return to
the follow's exit is the pass (its changes answer and the 10 consumes). The
reference: those 10 files removed from the consumer, `dyad sync new/` once
(the listing and the same 10 consumes). FOLLOW_ROUNDS interleaved rounds
(default 5), medians and p90 / max. Results: $DYAD_BENCH_OUT/follow.json."""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402

RAW = os.path.join(harness.BUILD, "bin", "bench_etcd_raw")
OUT = os.environ.get("DYAD_BENCH_OUT", os.path.join(harness.BUILD, "bench"))
SIZES = [int(os.environ.get("FOLLOW_SMALL", "10000")), int(os.environ.get("FOLLOW_LARGE", "100000"))]
ROUNDS = int(os.environ.get("FOLLOW_ROUNDS", "5"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def changes_requests(node):
    return node.status()["metadata_store"]["changes_requests"]


def one_round(c, tag):
    prod, cons = c[0], c[1]
    names = [f"new/{tag}/f{i}" for i in range(10)]
    for n in names:
        os.makedirs(os.path.dirname(prod.path(n)), exist_ok=True)
        with open(prod.path(n), "w") as fh:
            fh.write("0123456789abcdef" * 4)
    follow = cons.dyad_async("sync", "--follow", "--count", "10", f"new/{tag}")
    # Past its first listing: asking for changes.
    base = changes_requests(cons)
    harness.wait_for(lambda: changes_requests(cons) >= base + 3 or follow.poll() is not None, 600,
                     what="the follow asking for changes")
    prod.dyad("produce", *[prod.path(n) for n in names])
    t0 = time.monotonic()
    follow.communicate(timeout=600)
    follow_s = time.monotonic() - t0
    assert follow.returncode == 0
    for n in names:
        os.unlink(cons.path(n))
    t0 = time.monotonic()
    cons.dyad("sync", f"new/{tag}")
    list_s = time.monotonic() - t0
    assert all(os.path.exists(cons.path(n)) for n in names)
    return follow_s, list_s


def main():
    os.makedirs(OUT, exist_ok=True)
    value = json.dumps({"path": "fill/part.dat", "owner": "bench", "node": "bench",
                        "endpoints": ["tcp://127.0.0.1:9"], "producer_dir": "/scratch/bench", "size": 4096,
                        "mtime_ns": 1718000000000000000, "mode": 420, "ino": 1000})
    etcds, clusters = [], []
    res = {"rounds": ROUNDS, "sizes": {}}
    try:
        for size in SIZES:
            e = harness.Etcd()
            etcds.append(e)
            subprocess.run(e.prefix + [RAW, e.endpoint, "fill", str(size), "/dyad/ns/dyad/files/fill/", value],
                           check=True, capture_output=True)
            c = harness.Cluster(nodes=2, kvs=e.uri, start=False)
            clusters.append(c)
            for n in c.nodes:  # (the quota past the records filled)
                n.start(["--store-max-records-per-namespace", str(2 * size + 1000)])
        acc = {s: {"follow": [], "list": []} for s in SIZES}
        for r in range(ROUNDS):  # interleaved
            for size, c in zip(SIZES, clusters):
                f, l = one_round(c, f"r{r}")
                acc[size]["follow"].append(f)
                acc[size]["list"].append(l)
        for s in SIZES:
            a = acc[s]
            res["sizes"][str(s)] = {k: {"p50_s": statistics.median(v), "p90_s": pct(v, 90), "max_s": max(v)}
                                    for k, v in a.items()}
    finally:
        for c in clusters:
            c.cleanup()
        for e in etcds:
            e.cleanup()
    print(f"dyad sync --follow on etcd, a pass finding 10 new records; {ROUNDS} interleaved rounds, "
          "seconds p50 / p90 / max")
    print(f"{'records':>10} {'follow pass (changes)':>26} {'listing pass (before)':>26}  ratio p50")
    for s in SIZES:
        f, l = res["sizes"][str(s)]["follow"], res["sizes"][str(s)]["list"]
        print(f"{s:>10} {f['p50_s']:8.3f} / {f['p90_s']:6.3f} / {f['max_s']:6.3f} "
              f"{l['p50_s']:8.3f} / {l['p90_s']:6.3f} / {l['max_s']:6.3f}  {f['p50_s'] / l['p50_s']:.3f}x")
    small, large = (res["sizes"][str(s)] for s in SIZES)
    print(f"large / small: follow {large['follow']['p50_s'] / small['follow']['p50_s']:.2f}x, "
          f"listing {large['list']['p50_s'] / small['list']['p50_s']:.2f}x")
    with open(os.path.join(OUT, "follow.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
