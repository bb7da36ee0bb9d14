#!/usr/bin/env python3
"""UCX rows of `make bench`: DYAD_DTL_MODE=UCX moving a 256 MiB file and
1,000 files of 64 KiB between two services, per UCX_TLS, side by side in the
same run with ucx_perftest tag_bw and put_bw (same UCX_TLS, 4 MiB messages:
the backend's chunk size), and the ratio to the better of the two."""
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.environ.get("BENCH_QUICK") == "1"
REPS = 1 if QUICK else 3
BIG = (64 << 20) if QUICK else (256 << 20)
SMALL_N = 200 if QUICK else 1000
MSG = 4 << 20
TLS_SETS = [("tcp", "tcp"), ("shm", "sysv,self")]


def perftest(tls, test):
    port = harness.free_port()
    env = dict(os.environ, UCX_TLS=tls, UCX_WARN_UNUSED_ENV_VARS="n")
    srv = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        n = max(8, BIG // MSG)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s", str(MSG), "-n", str(n),
                              "-w", "4"], env=env, capture_output=True, text=True, timeout=120).stdout
    finally:
        srv.kill()
        srv.wait()
    m = re.search(r"Final:\s+\d+\s+\S+\s+\S+\s+\S+\s+(\S+)", out)
    return float(m.group(1)) * (1 << 20) / 1e9 if m else None  # MiB/s -> GB/s


def main():
    if "UCX" not in subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True).stdout:
        print("ucx bench: this build has no UCX transport; skipped")
        return 0
    results = {}
    for label, tls in TLS_SETS:
        env = {"UCX_TLS": tls, "UCX_WARN_UNUSED_ENV_VARS": "n"}
        with harness.Cluster(nodes=2, env=env) as c:
            prod, cons = c[0], c[1]
            ucx = {"DYAD_DTL_MODE": "UCX", "DYAD_WAIT_TIMEOUT": 60}
            big_times, small_times = [], []
            for r in range(REPS + 1):  # round 0 warms up
                name = f"big{r}.bin"
                harness.write_file(prod.path(name), BIG, seed=r)
                prod.dyad("produce", prod.path(name))
                t = time.monotonic()
                cons.dyad("consume", cons.path(name), env_extra=ucx)
                if r:
                    big_times.append(time.monotonic() - t)
                names = [f"s{r}/f{i:04d}" for i in range(SMALL_N)]
                for i, n in enumerate(names):
                    harness.write_file(prod.path(n), 65536, seed=i)
                prod.dyad("produce", *[prod.path(n) for n in names])
                t = time.monotonic()
                cons.dyad("consume", *[cons.path(n) for n in names], env_extra=ucx, timeout=600)
                if r:
                    small_times.append(time.monotonic() - t)
        tag, put = perftest(tls, "tag_bw"), perftest(tls, "ucp_put_bw")
        big = BIG / statistics.median(big_times) / 1e9
        best = max(x for x in (tag, put) if x) if (tag or put) else None
        results[label] = {"UCX_TLS": tls, "dyad_GBps": big, "dyad_runs_s": big_times,
                          "perftest_tag_bw_GBps": tag, "perftest_put_bw_GBps": put,
                          "ratio_vs_best": big / best if best else None,
                          "small_files_per_s": SMALL_N / statistics.median(small_times)}
    print(f"\nUCX: {BIG >> 20} MiB file and {SMALL_N} x 64 KiB, DYAD_DTL_MODE=UCX (median of {REPS})")
    print(f"  {'UCX_TLS':12} {'DYAD GB/s':>10} {'tag_bw':>8} {'put_bw':>8} {'ratio':>7} {'small files/s':>14}")
    for label, r in results.items():
        f = lambda v: f"{v:.2f}" if v else "n/a"
        print(f"  {r['UCX_TLS']:12} {r['dyad_GBps']:10.2f} {f(r['perftest_tag_bw_GBps']):>8} "
              f"{f(r['perftest_put_bw_GBps']):>8} {f(r['ratio_vs_best']):>7} {r['small_files_per_s']:14.0f}")
    print("  ratio = DYAD / max(tag_bw, put_bw); perftest moves 4 MiB messages memory to memory, DYAD moves a file")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "ucx.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
