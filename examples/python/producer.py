#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DYAD's Python demo, producer side: writes NUM_FILES files of NUM_INTS
uint64 (file i holds i*NUM_INTS .. (i+1)*NUM_INTS-1) into the
producer-managed directory with dyad_open("wb"), which publishes each file
when it is closed.

    DYAD_SERVICE_URI=... DYAD_PATH_PRODUCER=/local/a \\
        PYTHONPATH=python python3 examples/python/producer.py -n 10 -m 50
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
    ap.add_argument("-d", "--dir", default=os.environ.get("DYAD_PATH_PRODUCER"),
                    help="directory to write into (default: $DYAD_PATH_PRODUCER)")
    args = ap.parse_args()
    if not args.dir:
        ap.error("no directory: pass --dir or set DYAD_PATH_PRODUCER")
    m = args.num_ints
    try:
        for i in range(args.num_files):
            path = os.path.join(args.dir, f"file{i}.npy")
            data = np.arange(i * m, (i + 1) * m, dtype=np.uint64)
            with dyad_open(path, "wb") as f:
                np.save(f, data)
            print(f"produced {path}", flush=True)
    except DyadError as e:
        print(f"producer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
