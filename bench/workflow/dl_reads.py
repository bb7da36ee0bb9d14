# SPDX-License-Identifier: Apache-2.0
"""DLIO-like training reads, run as processes of nodes by
bench/workflow/workflow.py.

    dl_reads.py produce MODE DIR --first I --count N --size BYTES
    dl_reads.py train MODE DIR --count N --size BYTES --batch B --epochs E --out JSON

Samples are DIR/samples/s_IIIIII.npy: numpy uint8 arrays of --size bytes
(resnet50: 224x224x3 = 150,528 B; unet3d: ~140 MB, scaled by the caller);
sample i starts with its index (8 bytes) and has the same bytes after it as
every sample of its size, so the reader checks each one.

produce MODE: plain (np.save to a file of DIR), pydyad (pydyad.dyad_open
"wb": published on close).
train MODE: dyad (pydyad.torch.DyadDataset with its prefetch sampler, DIR
is the consumer directory), files (a plain Dataset of np.load over DIR: a
GlusterFS mount or node-local disk). A torch DataLoader with --workers
workers (default 2) reads a fixed shuffled order (the same for every mode)
for --epochs epochs; the JSON has, per epoch, the wall time, samples/s and
every batch wait (the time the training loop blocked in next()).
"""
import argparse
import json
import os
import random
import sys
import time

import numpy as np


def sample_body(size):
    return np.frombuffer(random.Random(size).randbytes(size), dtype=np.uint8).copy()


def sample_name(i):
    return os.path.join("samples", f"s_{i:06d}.npy")


def make_sample(body, i):
    a = body.copy()
    a[:8] = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)
    return a


def produce(a):
    body = sample_body(a.size)
    os.makedirs(os.path.join(a.dir, "samples"), exist_ok=True)
    opener = open
    if a.mode == "pydyad":
        from pydyad import dyad_open
        opener = dyad_open
    for i in range(a.first, a.first + a.count):
        with opener(os.path.join(a.dir, sample_name(i)), "wb") as f:
            np.save(f, make_sample(body, i), allow_pickle=False)


class Files:
    """The baseline's Dataset: np.load of each sample under a directory."""

    def __init__(self, root, names):
        self.root = root
        self.names = names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return np.load(os.path.join(self.root, self.names[i]), allow_pickle=False)


def train(a):
    import torch
    import torch.utils.data

    names = [sample_name(i) for i in range(a.count)]
    order = list(range(a.count))
    random.Random(7).shuffle(order)
    if a.mode == "dyad":
        from pydyad.torch import DyadDataset
        ds = DyadDataset(names, root=a.dir)
        sampler = ds.prefetch_sampler(order, ahead=a.ahead)
    else:
        ds = Files(a.dir, names)
        sampler = order
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers)
    body = torch.from_numpy(sample_body(a.size)[8:])
    epochs = []
    for e in range(a.epochs):
        waits = []
        seen = 0
        t0 = time.time()
        it = iter(loader)
        while True:
            tw = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - tw)
            idx = batch[:, :8].contiguous().view(torch.int64).flatten().tolist()
            pos = [order[k] for k in range(seen, seen + len(idx))]
            if idx != pos or not bool((batch[:, 8:] == body).all()):
                sys.exit(f"dl_reads: epoch {e}: batch of samples {pos} came back as {idx} or with other bytes")
            seen += len(idx)
            if a.compute:
                time.sleep(a.compute)
        wall = time.time() - t0
        if seen != a.count:
            sys.exit(f"dl_reads: epoch {e}: {seen} samples read, not {a.count}")
        epochs.append({"wall": wall, "samples": seen, "samples_per_s": seen / wall, "waits": waits})
    with open(a.out, "w") as f:
        json.dump({"mode": a.mode, "epochs": epochs}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("side", choices=["produce", "train"])
    p.add_argument("mode", choices=["plain", "pydyad", "dyad", "files"])
    p.add_argument("dir")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ahead", type=int, default=64, help="DyadPrefetchSampler's ahead")
    p.add_argument("--compute", type=float, default=0.0, help="seconds of 'training' per batch")
    p.add_argument("--out")
    a = p.parse_args()
    if a.size < 8:
        sys.exit("dl_reads: --size must be at least 8 bytes (the sample header)")
    if a.side == "produce":
        produce(a)
    else:
        if not a.out:
            sys.exit("dl_reads: train needs --out")
        train(a)


if __name__ == "__main__":
    main()
