#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""MARGO/OFI rows of `make bench`: DYAD_DTL_MODE=MARGO (libfabric pull)
moving a 256 MiB file and 1,000 files of 64 KiB between two services, per
protocol that works here, side by side in the same run with a raw fi_read
loop on the same provider (bench/ofi_read_bw.cpp: 4 MiB reads, 4 in flight,
memory to memory; DYAD reads 1 MiB chunks, 4 in flight) and cp of the same
file, with the ratios."""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402
import transport_runs  # noqa: E402

from transport_runs import BIG, QUICK, REPS, ROOT, ROUNDS, SMALL_N  # noqa: E402,F401
MSG = 4 << 20
PROTOS = ["ofi+tcp", "ofi+sockets", "ofi+shm"]
RAW = os.path.join(os.path.dirname(harness.DYAD), "bench_ofi_read_bw")


def raw_read_bw(proto):
    """(loop GB/s, whole-process GB/s): the raw client's fi_read loop alone,
    and the same bytes over the client process's wall time, which pays
    libfabric's start-up as every `dyad consume` process does."""
    srv = subprocess.Popen([RAW, "server", proto], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline().split()
        if len(line) != 3:
            return None, None
        count = max(16, BIG // MSG)
        t = time.monotonic()
        out = subprocess.run([RAW, "client", proto, *line, str(MSG), str(count), "4"],
                             capture_output=True, text=True, timeout=120)
        wall = time.monotonic() - t
        if out.returncode != 0:
            return None, None
        return float(out.stdout), MSG * count / wall / 1e9
    finally:
        srv.kill()
        srv.wait()


def startup_seconds(proto, reps=REPS):
    """(wall s, CPU s), medians: `fi_info -p PROVIDER` (libfabric-bin), which
    loads libfabric and its providers and calls fi_getinfo once, as every
    process that uses libfabric does before its first byte; None without
    fi_info. Here most of it is not libfabric's own (docs/design.md, MARGO,
    "Speed over ofi+tcp")."""
    import resource
    prov = proto.split("+", 1)[-1]
    walls, cpus = [], []
    for _ in range(reps):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.monotonic()
        try:
            p = subprocess.run(["fi_info", "-p", prov], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        if p.returncode != 0:
            return None
        walls.append(time.monotonic() - t)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def spread(xs):
    """(p50, p90, max) of a list of seconds."""
    xs = sorted(xs)
    p90 = statistics.quantiles(xs, n=10, method="inclusive")[8] if len(xs) > 1 else xs[0]
    return statistics.median(xs), p90, xs[-1]


def versus_stream(prod, cons, rounds, small_n=SMALL_N, big=BIG):
    """Seconds per round of one `dyad consume` process, MARGO beside the
    stream (FLUX_RPC), interleaved (the order alternates each round, after a
    warm-up round of each): `small_n` files of 64 KiB in one process, and one
    `big`-byte file (the whole process: start-up, lookup, transfer, check).
    Every copy is checked outside the timing."""
    modes = {"MARGO": {"DYAD_DTL_MODE": "MARGO"}, "stream": {"DYAD_DTL_MODE": "FLUX_RPC"}}
    harness.write_file(prod.path("vs/big.bin"), big, seed=7)
    prod.dyad("produce", prod.path("vs/big.bin"))
    big_hash = harness.sha256(prod.path("vs/big.bin"))
    small = {m: [] for m in modes}
    whole = {m: [] for m in modes}
    for r in range(rounds + 1):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for m in order:
            names = [f"vs{m}{r}/f{i:04d}" for i in range(small_n)]
            for i, n in enumerate(names):
                harness.write_file(prod.path(n), 65536, seed=i + r)
            prod.dyad("produce", *[prod.path(n) for n in names])
            os.sync()
            t = time.monotonic()
            cons.dyad("consume", *[cons.path(n) for n in names],
                      env_extra={**modes[m], "DYAD_WAIT_TIMEOUT": 60}, timeout=600)
            dt = time.monotonic() - t
            for n in names[::97]:
                if harness.sha256(cons.path(n)) != harness.sha256(prod.path(n)):
                    raise RuntimeError(f"{m}: {n} differs from the produced file")
            if r:
                small[m].append(dt)
        for m in order:
            transport_runs.prime_memory(cons.dir, big)
            t = time.monotonic()
            cons.dyad("consume", cons.path("vs/big.bin"), env_extra={**modes[m], "DYAD_WAIT_TIMEOUT": 60})
            dt = time.monotonic() - t
            if harness.sha256(cons.path("vs/big.bin")) != big_hash:
                raise RuntimeError(f"{m}: the consumed copy differs from the produced file")
            os.unlink(cons.path("vs/big.bin"))
            if r:
                whole[m].append(dt)
    return small, whole


def print_versus(proto, small, whole, small_n=SMALL_N, big=BIG):
    print(f"\nMARGO ({proto}) vs the stream, interleaved rounds ({len(small['MARGO'])} each; seconds per process "
          f"p50/p90/max; ratio = stream p50 / MARGO p50, goal >= 0.8)")
    for label, runs, unit in ((f"{small_n} x 64 KiB", small, lambda t: f"{small_n / t:7.0f} files/s"),
                              (f"{big >> 20} MiB whole process", whole, lambda t: f"{big / t / 1e9:5.2f} GB/s")):
        m, st = spread(runs["MARGO"]), spread(runs["stream"])
        print(f"  {label:26} MARGO {m[0]:.3f}/{m[1]:.3f}/{m[2]:.3f} ({unit(m[0])})  stream "
              f"{st[0]:.3f}/{st[1]:.3f}/{st[2]:.3f} ({unit(st[0])})  ratio {st[0] / m[0]:.2f}")


def available():
    cfg = json.loads(subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True).stdout)
    info = next((t["info"] for t in cfg["transports_built"] if t["name"] == "MARGO"), None)
    if info is None:
        return []
    return [p for p in PROTOS if p in info.split("available:")[-1].split()]


def main():
    if "--versus-only" in sys.argv:  # only the rows beside the stream (ofi+tcp)
        rounds = int(os.environ.get("OFI_VS_ROUNDS", ROUNDS))
        with harness.Cluster(nodes=2, env={"DYAD_MARGO_PROTO": "ofi+tcp"}) as c:
            small, whole = versus_stream(c[0], c[1], rounds)
        print_versus("ofi+tcp", small, whole)
        return 0
    protos = available()
    if not protos:
        print("ofi bench: this build has no libfabric transport, or no protocol works here; skipped")
        return 0
    results = {}
    for proto in protos:
        with harness.Cluster(nodes=2, env={"DYAD_MARGO_PROTO": proto}) as c:
            prod, cons = c[0], c[1]
            transfer = {}
            runs = transport_runs.big_file_rates(prod, cons, BIG, ROUNDS, {"dyad": {"DYAD_DTL_MODE": "MARGO"}},
                                                 transfer=transfer)
            small = transport_runs.small_file_times(prod, cons, SMALL_N, ROUNDS, {"DYAD_DTL_MODE": "MARGO"})
            vs_small, vs_whole = versus_stream(prod, cons, ROUNDS) if proto == "ofi+tcp" else (None, None)
        raws = [raw_read_bw(proto) for _ in range(ROUNDS)]
        startup = startup_seconds(proto)
        raw = statistics.median([r[0] for r in raws if r[0]]) if any(r[0] for r in raws) else None
        raw_proc = statistics.median([r[1] for r in raws if r[1]]) if any(r[1] for r in raws) else None
        dyad = statistics.median(runs["dyad"])
        dyad_transfer = statistics.median(transfer["dyad"])
        cp = statistics.median(runs["cp"])
        results[proto] = {"dyad_GBps": dyad, "dyad_transfer_GBps": dyad_transfer, "runs_GBps": runs,
                          "transfer_runs_GBps": transfer["dyad"], "raw_fi_read_GBps": raw,
                          "raw_process_GBps": raw_proc, "raw_runs": raws, "cp_GBps": cp,
                          "ratio_transfer_vs_raw": dyad_transfer / raw if raw else None,
                          "ratio_process_vs_raw_process": dyad / raw_proc if raw_proc else None,
                          "ratio_vs_cp": dyad / cp, "small_files_per_s": SMALL_N / statistics.median(small),
                          "libfabric_startup_s": startup[0] if startup else None,
                          "libfabric_startup_cpu_s": startup[1] if startup else None}
        if vs_small:
            results[proto]["vs_stream"] = {
                "small_s": vs_small, "whole_process_s": vs_whole,
                "small_ratio": statistics.median(vs_small["stream"]) / statistics.median(vs_small["MARGO"]),
                "whole_process_ratio": statistics.median(vs_whole["stream"]) / statistics.median(vs_whole["MARGO"])}
    print(f"\nMARGO/OFI: {BIG >> 20} MiB file and {SMALL_N} x 64 KiB, DYAD_DTL_MODE=MARGO (median of {ROUNDS})")
    print(f"  {'protocol':12} {'transfer':>8} {'fi_read':>8} {'ratio':>6} | {'process':>7} {'raw proc':>8} "
          f"{'ratio':>6} | {'cp':>5} {'vs cp':>6} | {'small files/s':>13} | {'start-up s':>10}")
    f = lambda v: f"{v:.2f}" if v else "n/a"  # noqa: E731
    for proto, r in results.items():
        print(f"  {proto:12} {r['dyad_transfer_GBps']:8.2f} {f(r['raw_fi_read_GBps']):>8} "
              f"{f(r['ratio_transfer_vs_raw']):>6} | {r['dyad_GBps']:7.2f} {f(r['raw_process_GBps']):>8} "
              f"{f(r['ratio_process_vs_raw_process']):>6} | {r['cp_GBps']:5.2f} {r['ratio_vs_cp']:6.2f} | "
              f"{r['small_files_per_s']:13.0f} | {f(r['libfabric_startup_s']):>10}")
    print("  GB/s. transfer = DYAD's transfer_s (fetch start to checked copy) vs the raw fi_read loop (4 MiB reads,")
    print("  4 in flight, memory to memory); process = wall time of one `dyad consume` process vs the raw client")
    print("  process, both paying libfabric's start-up. DYAD also reads a file and writes one: cp is the other yardstick.")
    print("  start-up = wall seconds of `fi_info -p PROVIDER` alone: loading libfabric and its providers, which every")
    print("  process pays once (docs/design.md, MARGO, \"Speed over ofi+tcp\")")
    for proto, r in results.items():
        if "vs_stream" in r:
            print_versus(proto, r["vs_stream"]["small_s"], r["vs_stream"]["whole_process_s"])
    transport_runs.save("ofi", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
