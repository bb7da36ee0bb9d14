#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""UCX rows of `make bench`: DYAD_DTL_MODE=UCX moving a 256 MiB file (with the
protocol UCX's endpoint calls for, and forced to tagged messages) and 1,000
files of 64 KiB between two services, per UCX_TLS, side by side in the same
run with ucx_perftest tag_bw and put_bw (same UCX_TLS, 4 MiB messages: the
backend's chunk size) and cp of the same file, with the ratios.

Then the rows against the stream (issue 38): UCX over tcp beside the stream
(DYAD_DTL_MODE=FLUX_RPC) on the same cluster, interleaved rounds (the order
rotated each round), p50/p90/max of each and the ratio of the medians:
1,000 files of 64 KiB in one `dyad consume` process (files/s; goal >= 0.8)
and one 256 MiB file (GB/s of the whole process; goal >= 1.0).
`--versus-stream-only` runs just those; BENCH_UCX_ROUNDS sets their rounds
(default 9)."""
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


def tails(xs):
    """p50/p90/max of a list of rates (nearest rank)."""
    ys = sorted(xs)
    return {"p50": statistics.median(ys), "p90": ys[min(len(ys) - 1, int(0.9 * len(ys)))],
            "min": ys[0], "max": ys[-1], "rounds": ys}


def versus_stream(rounds):
    """UCX over tcp beside the stream, interleaved rounds: 1,000 x 64 KiB
    (files/s) and 256 MiB (GB/s), each timed as one `dyad consume` process."""
    methods = {"UCX": {"DYAD_DTL_MODE": "UCX"}, "stream": {"DYAD_DTL_MODE": "FLUX_RPC"}}
    env = {"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    small = {m: [] for m in methods}
    big = {m: [] for m in methods}
    with harness.Cluster(nodes=2, env=env) as c:
        prod, cons = c[0], c[1]
        harness.write_file(prod.path("vs/big.bin"), BIG, seed=7)
        prod.dyad("produce", prod.path("vs/big.bin"))
        big_hash = harness.sha256(prod.path("vs/big.bin"))
        for r in range(rounds + 1):  # round 0 warms up, untimed
            order = list(methods) if r % 2 == 0 else list(reversed(methods))
            for m in order:
                names = [f"vs/s{r}{m}/f{i:04d}" for i in range(SMALL_N)]
                for i, n in enumerate(names):
                    harness.write_file(prod.path(n), 65536, seed=i)
                prod.dyad("produce", *[prod.path(n) for n in names])
                os.sync()
                t = time.monotonic()
                cons.dyad("consume", *[cons.path(n) for n in names],
                          env_extra={**methods[m], "DYAD_WAIT_TIMEOUT": 60}, timeout=600)
                dt = time.monotonic() - t
                if r:
                    small[m].append(SMALL_N / dt)
            for m in order:
                transport_runs.prime_memory(cons.dir, BIG)
                t = time.monotonic()
                cons.dyad("consume", cons.path("vs/big.bin"),
                          env_extra={**methods[m], "DYAD_WAIT_TIMEOUT": 60}, timeout=600)
                dt = time.monotonic() - t
                if harness.sha256(cons.path("vs/big.bin")) != big_hash:
                    raise RuntimeError(f"{m}: the consumed 256 MiB copy differs")
                os.unlink(cons.path("vs/big.bin"))
                if r:
                    big[m].append(BIG / dt / 1e9)
    out = {"small_files_per_s": {m: tails(v) for m, v in small.items()},
           "big_GBps": {m: tails(v) for m, v in big.items()}}
    out["small_ratio"] = out["small_files_per_s"]["UCX"]["p50"] / out["small_files_per_s"]["stream"]["p50"]
    out["big_ratio"] = out["big_GBps"]["UCX"]["p50"] / out["big_GBps"]["stream"]["p50"]
    print(f"\nUCX (UCX_TLS=tcp) beside the stream, {rounds} interleaved rounds (machine shared)")
    for row, unit, goal in (("small_files_per_s", "files/s", 0.8), ("big_GBps", "GB/s", 1.0)):
        what = f"{SMALL_N} x 64 KiB" if row.startswith("small") else f"{BIG >> 20} MiB"
        for m in methods:
            t = out[row][m]
            fmt = "{:.0f}" if unit == "files/s" else "{:.2f}"
            print(f"  {what:14} {m:7} {unit:8} p50 {fmt.format(t['p50']):>6}  p90 {fmt.format(t['p90']):>6}  "
                  f"min {fmt.format(t['min']):>6}  max {fmt.format(t['max']):>6}")
        ratio = out["small_ratio" if row.startswith("small") else "big_ratio"]
        print(f"  {what:14} UCX / stream (p50): {ratio:.2f} (goal >= {goal})")
    return out


def main():
    if "UCX" not in harness.built_transports():
        print("ucx bench: this build has no UCX transport; skipped")
        return 0
    rounds = int(os.environ.get("BENCH_UCX_ROUNDS", "2" if QUICK else "9"))
    if "--versus-stream-only" in sys.argv:
        transport_runs.save("ucx_vs_stream", versus_stream(rounds))
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
    results["versus_stream"] = versus_stream(rounds)
    transport_runs.save("ucx", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
