#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DYAD's Python demo, consumer side: reads the NUM_FILES files of
producer.py from the consumer-managed directory with dyad_open("rb"), which
waits for each to be produced and brings it here, then checks every value.
Exits 1 on the first mismatch, 2 on a DYAD error. Start it before the
producer.

    DYAD_SERVICE_URI=... DYAD_PATH_CONSUMER=/local/b \\
        PYTHONPATH=python python3 examples/python/consumer.py -n 10 -m 50
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from pydyad import DyadError, dyad_open  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--num-files", type=int, default=10)
    ap.add_argument("-m", "--num-ints", type=int, default=50)
    ap.add_argument("-d", "--dir", default=os.environ.get("DYAD_PATH_CONSUMER"),
                    help="directory to read from (default: $DYAD_PATH_CONSUMER)")
    args = ap.parse_args()
    if not args.dir:
        ap.error("no directory: pass --dir or set DYAD_PATH_CONSUMER")
    m = args.num_ints
    for i in range(args.num_files):
        path = os.path.join(args.dir, f"file{i}.npy")
        try:
            with dyad_open(path, "rb") as f:
                data = np.load(f, allow_pickle=False)
        except DyadError as e:
            print(f"consumer: {e}", file=sys.stderr)
            return 2
        if data.dtype != np.uint64 or data.shape != (m,):
            print(f"consumer: {path}: expected {m} uint64, got {data.shape} {data.dtype}", file=sys.stderr)
            return 1
        for j in range(m):
            expected = i * m + j
            if int(data[j]) != expected:
                print(f"consumer: {path}: value {j} is {int(data[j])}, expected {expected}", file=sys.stderr)
                return 1
        print(f"consumed {path}: {m} values ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
