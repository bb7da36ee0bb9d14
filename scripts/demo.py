#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make demo: two DYAD services as two nodes on loopback. A consumer that
waits for 20 files starts first; then a producer writes them (0 B to 64 MiB,
one in a nested directory). Every file is checked byte for byte (SHA-256) and
a table of per-file wait time, transfer time and throughput is printed."""
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SIZES = [0, 1, 100, 4096, 65536, 100_000, 1 << 20, 3 << 20, 8 << 20, 16 << 20,
         64 << 20, 512, 2 << 20, 5 << 20, 10_000_000, 32 << 20, 7, 123_456, 48 << 20, 256 << 10]




def main():
    t_start = time.monotonic()
    names = [f"file{i:02d}.bin" for i in range(len(SIZES))]
    names[7] = "nested/deeper/file07.bin"
    with harness.Cluster(nodes=2) as c:
        prod, cons = c[0], c[1]
        print(f"node0 (producer): dyadd at {prod.uri}, directory {prod.dir}, hosts the metadata store")
        print(f"node1 (consumer): dyadd at {cons.uri}, directory {cons.dir}, metadata at {prod.uri}")
        targets = [cons.path(n) for n in names]
        consumer = cons.dyad_async("--json", "consume", *targets, env_extra={"DYAD_WAIT_TIMEOUT": 120})
        cons.wait_waiters(1, procs=[consumer])  # it waits for files that do not exist yet
        print(f"consumer started first, waiting for {len(names)} files ...")
        digests = {}
        for name, size in zip(names, SIZES):
            p = prod.path(name)
            harness.write_file(p, size, seed=hash(name) & 0xffff)
            digests[name] = harness.sha256(p)
            prod.dyad("produce", p)
        out, err = consumer.communicate(timeout=300)
        if consumer.returncode != 0:
            print(err, file=sys.stderr)
            print(f"DEMO FAILED: consumer exited with {consumer.returncode}")
            return 1
        reports = [json.loads(line) for line in out.splitlines() if line.strip()]
        ok = True
        rows = []
        for name, size, r in zip(names, SIZES, reports):
            got = harness.sha256(cons.path(name))
            match = got == digests[name]
            ok &= match
            mbps = (r["bytes"] / r["transfer_s"] / 1e6) if r["transfer_s"] > 0 and r["bytes"] else 0.0
            rows.append((name, size, r["wait_s"], r["transfer_s"], mbps, "ok" if match else "MISMATCH"))
        print()
        print(f"{'file':28} {'bytes':>10} {'wait s':>8} {'transfer s':>10} {'MB/s':>9}  sha256")
        for name, size, w, t, mbps, verdict in rows:
            print(f"{name:28} {size:>10} {w:>8.3f} {t:>10.4f} {mbps:>9.1f}  {verdict}")
        total = sum(SIZES)
        moved = sum(r[3] for r in rows)
        print(f"\n{len(rows)} files, {total / 1e6:.1f} MB, transfer time {moved:.3f} s "
              f"({total / moved / 1e6 if moved else 0:.0f} MB/s overall)")
        st = prod.status()["counters"]
        print(f"producer service: {st['served']} fetches served, {st['bytes_sent']} bytes sent, {st['errors']} errors")
        if len(rows) != len(names) or not ok:
            print("DEMO FAILED: some files did not arrive intact")
            return 1
    print(f"all {len(names)} files verified byte for byte; services stopped; {time.monotonic() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
