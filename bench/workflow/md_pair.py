# SPDX-License-Identifier: Apache-2.0
"""One side of an MD producer/consumer pair (HiCOMB 2024's pipeline), run as
a process of one node by bench/workflow/workflow.py.

    md_pair.py produce MODE DIR --pair P --frames N --size BYTES --sim SECONDS --out JSON
    md_pair.py consume MODE DIR --pair P --frames N --size BYTES --out JSON

Frames are DIR/pairP/frame_IIIII.bin; frame i of pair p is a 16-byte header
(p, i) followed by bytes that depend on the size only, so that the consumer
checks every byte without reading any other copy.

produce MODE:
  plain     open/write/close (node-local disk; under LD_PRELOAD of
            libdyad_wrapper.so the close publishes it)
  pydyad    pydyad.dyad_open(path, "wb"): published on close
  rename    a shared file system: written to a hidden name, renamed to the
            frame's name when complete (what users do so that pollers never
            see half a frame); a marker DIR/pairP/done after the last frame
consume MODE:
  plain     open() then read (under the wrapper: the open waits for the
            frame and brings it to this node)
  pydyad    get_metadata(should_wait=True), consume_w_metadata, then read
  poll      stat loop (every --poll seconds) until the frame exists, then read
  barrier   waits for the producer's marker (stat loop), then reads all

Each side writes a JSON list of per-frame wall-clock times (time.time():
every node is a namespace of one machine, one clock): the producer's
t_write (write start) and t_published (close or rename returned); the
consumer's t_begin (started waiting for the frame), t_found (known to be
there, where the mode tells), t_done (read and checked).
"""
import argparse
import json
import os
import random
import sys
import time


def frame_body(size):
    """The bytes after the header: pseudo-random, the same for every frame
    of a size."""
    return random.Random(size).randbytes(max(0, size - 16))


def header(pair, i):
    return pair.to_bytes(8, "little") + i.to_bytes(8, "little")


def frame_path(d, pair, i):
    return os.path.join(d, f"pair{pair}", f"frame_{i:05d}.bin")


def simulate(seconds):
    """The MD step: `seconds` asleep. A real simulation computes on its own
    node; here every node shares the same two cores, and a busy loop would
    take them from the data movement being measured."""
    if seconds > 0:
        time.sleep(seconds)


def produce(a):
    body = frame_body(a.size)
    d = os.path.join(a.dir, f"pair{a.pair}")
    os.makedirs(d, exist_ok=True)
    out = []
    opener = open
    if a.mode == "pydyad":
        from pydyad import dyad_open
        opener = dyad_open
    for i in range(a.frames):
        simulate(a.sim)
        path = frame_path(a.dir, a.pair, i)
        t0 = time.time()
        if a.mode == "rename":
            tmp = os.path.join(d, f".frame_{i:05d}.tmp")
            with open(tmp, "wb") as f:
                f.write(header(a.pair, i))
                f.write(body)
            os.rename(tmp, path)
        else:
            with opener(path, "wb") as f:
                f.write(header(a.pair, i))
                f.write(body)
        out.append({"t_write": t0, "t_published": time.time()})
    if a.mode == "rename":
        with open(os.path.join(d, ".done.tmp"), "w") as f:
            f.write(str(a.frames))
        os.rename(os.path.join(d, ".done.tmp"), os.path.join(d, "done"))
    return out


def check(data, a, i, path):
    if len(data) != a.size or data[:16] != header(a.pair, i) or data[16:] != check.body:
        sys.exit(f"md_pair: {path}: {len(data)} bytes, not the {a.size} bytes of frame {i} of pair {a.pair}"
                 + (" (same size, different bytes)" if len(data) == a.size else ""))


def wait_exists(path, interval, deadline):
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"md_pair: {path} did not appear within the deadline (--timeout)")
        time.sleep(interval)


def consume(a):
    check.body = frame_body(a.size)
    deadline = time.monotonic() + a.timeout
    out = []
    dyad = None
    if a.mode == "pydyad":
        from pydyad import Dyad
        dyad = Dyad()
        dyad.init_env()
    if a.mode == "barrier":
        wait_exists(os.path.join(a.dir, f"pair{a.pair}", "done"), a.poll, deadline)
    for i in range(a.frames):
        path = frame_path(a.dir, a.pair, i)
        t_begin = time.time()
        t_found = None
        if a.mode == "pydyad":
            md = dyad.get_metadata(path, should_wait=True)
            t_found = time.time()
            try:
                dyad.consume_w_metadata(path, md)
            finally:
                dyad.free_metadata(md)
        elif a.mode == "poll":
            wait_exists(path, a.poll, deadline)
            t_found = time.time()
        elif a.mode == "barrier":
            t_found = t_begin
        with open(path, "rb") as f:
            data = f.read()
        check(data, a, i, path)
        out.append({"t_begin": t_begin, "t_found": t_found, "t_done": time.time()})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("side", choices=["produce", "consume"])
    p.add_argument("mode", choices=["plain", "pydyad", "rename", "poll", "barrier"])
    p.add_argument("dir")
    p.add_argument("--pair", type=int, default=0)
    p.add_argument("--frames", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--sim", type=float, default=0.0, help="seconds of simulation before each frame")
    p.add_argument("--poll", type=float, default=0.005, help="stat-loop interval (poll, barrier)")
    p.add_argument("--timeout", type=float, default=600.0, help="the consumer gives up after this many seconds")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.size < 16:
        sys.exit("md_pair: --size must be at least 16 bytes (the frame header)")
    t_start = time.time()
    frames = produce(a) if a.side == "produce" else consume(a)
    with open(a.out, "w") as f:
        json.dump({"side": a.side, "mode": a.mode, "t_start": t_start, "t_end": time.time(), "frames": frames}, f)


if __name__ == "__main__":
    main()
