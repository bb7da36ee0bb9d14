# SPDX-License-Identifier: Apache-2.0
"""The MD frame stream over MPI point-to-point: the process-to-process
reference of bench/outside (two ranks, one per node, started by mpirun).

    mpirun -np 2 ... python3 mpi_frames.py --frames N --size BYTES --out JSON

Rank 0 sends frame i (the same bytes as bench/workflow/md_pair.py's: a
16-byte header (pair 0, i) and a body that depends on the size only) with
MPI_Send from one buffer it rewrites per frame; rank 1 receives each into
one buffer and checks every byte. Both start after a barrier; rank 1 writes
per-frame wall-clock receive times (time.time(): one machine, one clock),
the stream's wall time and frames per second. One warm-up frame, untimed.
"""
import argparse
import json
import os
import random
import sys
import time

import numpy as np
from mpi4py import MPI


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frames", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        sys.exit(f"mpi_frames: needs exactly 2 ranks, not {comm.Get_size()}")
    rank = comm.Get_rank()
    # The two ranks must be on different "nodes" (network namespaces).
    netns = comm.allgather(os.stat("/proc/self/ns/net").st_ino)
    if netns[0] == netns[1]:
        sys.exit("mpi_frames: both ranks run in the same network namespace: not two nodes")
    body = np.frombuffer(random.Random(a.size).randbytes(max(0, a.size - 16)), dtype=np.uint8)
    buf = np.empty(a.size, dtype=np.uint8)
    if rank == 0:
        buf[16:] = body
    header = buf[:16].view(np.int64)
    for warm in (True, False):
        comm.Barrier()
        t0 = time.time()
        times = []
        for i in range(1 if warm else a.frames):
            if rank == 0:
                header[0], header[1] = 0, i
                comm.Send([buf, MPI.BYTE], dest=1, tag=i)
            else:
                comm.Recv([buf, MPI.BYTE], source=0, tag=i)
                if header[0] != 0 or header[1] != i or not np.array_equal(buf[16:], body):
                    sys.exit(f"mpi_frames: frame {i} arrived with other bytes")
                times.append(time.time())
        t_end = time.time()
    if rank == 1:
        wall = t_end - t0
        gaps = [t - s for s, t in zip([t0] + times[:-1], times)]
        with open(a.out, "w") as f:
            json.dump({"method": "mpi", "frames": a.frames, "size": a.size, "t_start": t0, "wall": wall,
                       "frames_per_s": a.frames / wall, "MiB_per_s": a.frames * a.size / wall / (1 << 20),
                       "frame_gaps": gaps, "frame_done": times, "mpi": MPI.Get_library_version().splitlines()[0]}, f)


if __name__ == "__main__":
    main()
