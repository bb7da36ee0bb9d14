# SPDX-License-Identifier: Apache-2.0
"""What an etcd outage costs a dyadd's answers (issue 33, item 1).

Two nodes in network namespaces on the harness's etcd. Each round: `dyad
service status` and GET /healthz timed with etcd up (the reference) and then
with etcd killed (SIGKILL), interleaved in the same run; then etcd is started
again and the time until the dyadd says the store is reachable is taken, and
the time until a consumer that waited through the outage has its file (from
the producer's publish after the restart). Figures: p50/p90/max, and the
ratio down/up of the medians.

    DYAD_BUILD_DIR=build python3 bench/outage_bench.py [--rounds 5] [--samples 5]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402

GET = ("import sys, urllib.request, urllib.error\n"
       "try:\n    urllib.request.urlopen(sys.argv[1], timeout=30).read()\n"
       "except urllib.error.HTTPError as e:\n    e.read()\n")


def timed(fn):
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def row(name, xs, ref=None):
    p50 = statistics.median(xs)
    text = f"{name:<40} p50 {p50 * 1e3:8.1f} ms  p90 {pct(xs, 0.9) * 1e3:8.1f} ms  max {max(xs) * 1e3:8.1f} ms"
    if ref:
        text += f"  ratio to up {p50 / statistics.median(ref):5.2f}x"
    print(text, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=5)
    a = ap.parse_args()
    c = harness.Cluster(nodes=2, netns="require", store="etcd", start=False)
    try:
        c.etcd.start()
        for n in c.nodes:
            n.metrics_port = harness.free_port("127.0.0.1")
            n.start(["--metrics-listen", f"{n.host}:{n.metrics_port}"])
        prod, cons = c[0], c[1]
        url = f"http://{cons.host}:{cons.metrics_port}/healthz"

        def status():
            cons.dyad("--json", "service", "status", timeout=60)

        def healthz():
            subprocess.run(cons.prefix + ["/usr/bin/python3", "-c", GET, url], check=True, timeout=60)

        def reachable():
            return cons.status()["metadata_store"]["reachable"]

        up_s, down_s, up_h, down_h, back, got = [], [], [], [], [], []
        for r in range(a.rounds):
            for _ in range(a.samples):
                up_s.append(timed(status))
                up_h.append(timed(healthz))
            rel = f"round{r}.txt"
            w = harness.NodeView(cons, os.path.join(c.root, f"w{r}"))
            p = w.dyad_async("consume", "--timeout", "120", w.path(rel))
            cons.wait_waiters(1, procs=[p])
            c.etcd.kill()
            harness.wait_for(lambda: not reachable(), 30, what="store down", interval=0.05)
            for _ in range(a.samples):
                down_s.append(timed(status))
                down_h.append(timed(healthz))
            c.etcd.start()
            t0 = time.monotonic()
            harness.wait_for(reachable, 30, what="store back", interval=0.02)
            back.append(time.monotonic() - t0)
            t1 = time.monotonic()
            prod.produce_text(rel, f"round {r}\n")
            p.communicate(timeout=120)
            got.append(time.monotonic() - t1)
            assert p.returncode == 0
        print(f"# {a.rounds} rounds x {a.samples} samples, interleaved; machine shared with other builds")
        row("dyad service status, etcd up", up_s)
        row("dyad service status, etcd down", down_s, up_s)
        row("GET /healthz, etcd up", up_h)
        row("GET /healthz, etcd down (503)", down_h, up_h)
        row("etcd healthy -> dyadd says reachable", back)
        row("publish after restart -> waiter has file", got)
    finally:
        c.cleanup()


if __name__ == "__main__":
    main()
