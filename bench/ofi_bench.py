#!/usr/bin/env python3
"""MARGO/OFI rows of `make bench`: DYAD_DTL_MODE=MARGO (libfabric pull)
moving a 256 MiB file and 1,000 files of 64 KiB between two services, per
protocol that works here, side by side in the same run with a raw fi_read
loop on the same provider (bench/ofi_read_bw.cpp: 4 MiB reads, 4 in flight,
like DYAD) and cp of the same file, with the ratios."""
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import harness  # noqa: E402
import transport_runs  # noqa: E402

from transport_runs import BIG, QUICK, REPS, ROOT, SMALL_N  # noqa: E402,F401
MSG = 4 << 20
PROTOS = ["ofi+tcp", "ofi+sockets", "ofi+shm"]
RAW = os.path.join(os.path.dirname(harness.DYAD), "bench_ofi_read_bw")


def raw_read_bw(proto):
    srv = subprocess.Popen([RAW, "server", proto], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline().split()
        if len(line) != 3:
            return None
        out = subprocess.run([RAW, "client", proto, *line, str(MSG), str(max(16, BIG // MSG)), "4"],
                             capture_output=True, text=True, timeout=120)
        return float(out.stdout) if out.returncode == 0 else None
    finally:
        srv.kill()
        srv.wait()


def available():
    cfg = json.loads(subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True).stdout)
    info = next((t["info"] for t in cfg["transports_built"] if t["name"] == "MARGO"), None)
    if info is None:
        return []
    return [p for p in PROTOS if p in info.split("available:")[-1].split()]


def main():
    protos = available()
    if not protos:
        print("ofi bench: this build has no libfabric transport, or no protocol works here; skipped")
        return 0
    results = {}
    for proto in protos:
        with harness.Cluster(nodes=2, env={"DYAD_MARGO_PROTO": proto}) as c:
            prod, cons = c[0], c[1]
            runs = transport_runs.big_file_rates(prod, cons, BIG, REPS, {"dyad": {"DYAD_DTL_MODE": "MARGO"}})
            small = transport_runs.small_file_times(prod, cons, SMALL_N, REPS, {"DYAD_DTL_MODE": "MARGO"})
        raw = raw_read_bw(proto)
        dyad = statistics.median(runs["dyad"])
        cp = statistics.median(runs["cp"])
        results[proto] = {"dyad_GBps": dyad, "runs_GBps": runs, "raw_fi_read_GBps": raw, "cp_GBps": cp,
                          "ratio_vs_raw": dyad / raw if raw else None, "ratio_vs_cp": dyad / cp,
                          "small_files_per_s": SMALL_N / statistics.median(small)}
    print(f"\nMARGO/OFI: {BIG >> 20} MiB file and {SMALL_N} x 64 KiB, DYAD_DTL_MODE=MARGO (median of {REPS})")
    print(f"  {'protocol':12} {'DYAD GB/s':>9} {'fi_read':>8} {'ratio':>6} {'cp GB/s':>7} {'vs cp':>6} {'small files/s':>13}")
    for proto, r in results.items():
        f = lambda v: f"{v:.2f}" if v else "n/a"
        print(f"  {proto:12} {r['dyad_GBps']:9.2f} {f(r['raw_fi_read_GBps']):>8} {f(r['ratio_vs_raw']):>6} "
              f"{r['cp_GBps']:7.2f} {r['ratio_vs_cp']:6.2f} {r['small_files_per_s']:13.0f}")
    print("  ratio = DYAD / raw fi_read loop (4 MiB reads, 4 in flight, memory to memory, cache-hot);")
    print("  DYAD reads a file and writes a file, so cp of the same file on the same disk is the other yardstick")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "ofi.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
