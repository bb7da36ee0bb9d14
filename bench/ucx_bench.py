#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""UCX rows of `make bench`: DYAD_DTL_MODE=UCX moving a 256 MiB file (with the
protocol UCX's endpoint calls for, and forced to tagged messages) and 1,000
files of 64 KiB between two services, per UCX_TLS, side by side in the same
run with ucx_perftest tag_bw and put_bw (same UCX_TLS, 4 MiB messages: the
backend's chunk size) and cp of the same file, with the ratios."""
import os
import re
import statistics
import subprocess
import time
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402
import transport_runs  # noqa: E402

from transport_runs import BIG, QUICK, REPS, ROOT, ROUNDS, SMALL_N  # noqa: E402,F401
MSG = 4 << 20
TLS_SETS = [("tcp", "tcp"), ("shm", "sysv,self")]


def perftest(tls, test):
    port = harness.free_port()
    env = dict(os.environ, UCX_TLS=tls, UCX_WARN_UNUSED_ENV_VARS="n")
    srv = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        # Not wait_listening: ucx_perftest's server takes one connection, and a
        # probe would be it. Its start-up is the only thing waited for.
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
    if "UCX" not in harness.built_transports():
        print("ucx bench: this build has no UCX transport; skipped")
        return 0
    results = {}
    for label, tls in TLS_SETS:
        env = {"UCX_TLS": tls, "UCX_WARN_UNUSED_ENV_VARS": "n"}
        if label == "shm":  # dyadd's opt-in (docs/security.md)
            env["DYAD_UCX_SHARED_MEMORY"] = "1"
        with harness.Cluster(nodes=2, env=env) as c:
            prod, cons = c[0], c[1]
            runs = transport_runs.big_file_rates(prod, cons, BIG, ROUNDS, {
                "auto": {"DYAD_DTL_MODE": "UCX", "DYAD_UCX_PROTO": "auto"},
                "tag": {"DYAD_DTL_MODE": "UCX", "DYAD_UCX_PROTO": "tag"}})
            mode = "put" if prod.status()["counters"]["per_transport"]["UCX"]["transport"]["put_transfers"] else "tag"
            small_times = transport_runs.small_file_times(prod, cons, SMALL_N, ROUNDS, {"DYAD_DTL_MODE": "UCX"})
        tag, put = perftest(tls, "tag_bw"), perftest(tls, "ucp_put_bw")
        auto = statistics.median(runs["auto"])
        best = max(x for x in (tag, put) if x) if (tag or put) else None
        results[label] = {"UCX_TLS": tls, "auto_protocol": mode, "dyad_auto_GBps": auto,
                          "dyad_tag_GBps": statistics.median(runs["tag"]), "runs_GBps": runs,
                          "cp_GBps": statistics.median(runs["cp"]),
                          "perftest_tag_bw_GBps": tag, "perftest_put_bw_GBps": put,
                          "ratio_vs_perftest": auto / best if best else None,
                          "ratio_vs_cp": auto / statistics.median(runs["cp"]),
                          "small_files_per_s": SMALL_N / statistics.median(small_times)}
    print(f"\nUCX: {BIG >> 20} MiB file and {SMALL_N} x 64 KiB, DYAD_DTL_MODE=UCX (median of {ROUNDS})")
    print(f"  {'UCX_TLS':10} {'proto':>5} {'auto GB/s':>9} {'tag GB/s':>8} {'tag_bw':>7} {'put_bw':>7} "
          f"{'ratio':>6} {'cp GB/s':>7} {'vs cp':>6} {'small files/s':>13}")
    for label, r in results.items():
        f = lambda v: f"{v:.2f}" if v else "n/a"
        print(f"  {r['UCX_TLS']:10} {r['auto_protocol']:>5} {r['dyad_auto_GBps']:9.2f} {r['dyad_tag_GBps']:8.2f} "
              f"{f(r['perftest_tag_bw_GBps']):>7} {f(r['perftest_put_bw_GBps']):>7} {f(r['ratio_vs_perftest']):>6} "
              f"{r['cp_GBps']:7.2f} {r['ratio_vs_cp']:6.2f} {r['small_files_per_s']:13.0f}")
    print("  ratio = DYAD auto / max(tag_bw, put_bw): perftest moves 4 MiB messages memory to memory (cache-hot);")
    print("  DYAD reads a file and writes a file, so cp of the same file on the same disk is the other yardstick")
    transport_runs.save("ucx", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
