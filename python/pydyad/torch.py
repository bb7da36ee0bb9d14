# SPDX-License-Identifier: Apache-2.0
"""PyTorch integration: a map-style Dataset whose samples arrive through DYAD.

    from pydyad.torch import DyadDataset
    ds = DyadDataset(["s0.npy", "s1.npy"])           # relative to DYAD_PATH_CONSUMER
    for batch in torch.utils.data.DataLoader(ds, num_workers=2): ...

Each __getitem__ waits until the sample has been produced (on any node), has
DYAD bring it into the consumer-managed directory, then loads it. A sample
already present (e.g. in the second epoch) is not transferred again.

DYAD's context is process-wide and owns network connections, so it is
created lazily in the process that first reads a sample (each DataLoader
worker after fork or spawn), never in __init__; a context inherited through
fork is replaced.

Prefetching: a DataLoader asks for one sample at a time, so each is looked
up and fetched on its own. Wrap the sampler to have DYAD bring the next
samples in ahead of the loader, many in flight (Dyad.consume_many):

    sampler = ds.prefetch_sampler(torch.utils.data.RandomSampler(ds), ahead=256)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, num_workers=2)

The sampler runs in the process that iterates the loader; a thread of that
process consumes the samples of the next `ahead` indices while the workers
read earlier ones. A worker's __getitem__ then finds its sample present, or
waits for the transfer already under way (one transfer per file and node),
or, if prefetching failed, consumes it itself and reports the error.
"""
import collections
import os
import queue
import threading

import numpy as np
import torch.utils.data

from .bindings import Dyad

__all__ = ["DyadDataset", "DyadPrefetchSampler", "load_npy"]


def load_npy(path):
    """Default loader: a numpy array from a .npy file (no pickles)."""
    return np.load(path, allow_pickle=False)


class DyadDataset(torch.utils.data.Dataset):
    """Map-style dataset over sample names relative to the consumer dir.

    samples: sequence of relative paths.
    root: consumer-managed directory (default: $DYAD_PATH_CONSUMER).
    loader: callable(path) -> sample (default: numpy.load of a .npy file).
    transform: optional callable applied to the loaded sample.
    dyad_init: None to initialise DYAD from the environment (init_env), or a
        dict of Dyad.init keyword arguments (cons_managed_path defaults to root).
    use_metadata: look the sample up with get_metadata(should_wait=True) and
        consume_w_metadata instead of consume (same result, two steps).
    """

    def __init__(self, samples, root=None, loader=None, transform=None, dyad_init=None,
                 use_metadata=False):
        self.samples = list(samples)
        if root is None:
            root = os.environ.get("DYAD_PATH_CONSUMER")
            if not root:
                raise ValueError("DyadDataset: pass root= or set DYAD_PATH_CONSUMER "
                                 "(the consumer-managed directory the samples appear in)")
        self.root = os.path.abspath(os.fspath(root))
        for s in self.samples:
            if os.path.isabs(os.fspath(s)):
                raise ValueError(f"DyadDataset: sample {s!r} must be relative to {self.root}")
        self.loader = loader if loader is not None else load_npy
        self.transform = transform
        self.dyad_init = dict(dyad_init) if dyad_init is not None else None
        self.use_metadata = use_metadata
        self._dyad = None
        self._dyad_pid = None

    def __len__(self):
        return len(self.samples)

    def path(self, index):
        return os.path.join(self.root, os.fspath(self.samples[index]))

    @property
    def dyad(self):
        """This process's Dyad, created on first use in each process."""
        pid = os.getpid()
        if self._dyad is None or self._dyad_pid != pid:
            d = Dyad()
            if self.dyad_init is None:
                d.init_env()
            else:
                kw = dict(self.dyad_init)
                kw.setdefault("cons_managed_path", self.root)
                d.init(**kw)
            self._dyad, self._dyad_pid = d, pid
        return self._dyad

    def __getitem__(self, index):
        path = self.path(index)
        d = self.dyad
        if self.use_metadata:
            md = d.get_metadata(path, should_wait=True)
            try:
                d.consume_w_metadata(path, md)
            finally:
                d.free_metadata(md)
        else:
            d.consume(path)
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample

    def prefetch_sampler(self, sampler=None, ahead=64, window=0):
        """A sampler yielding `sampler`'s indices (default: 0..len-1 in
        order) that has the samples of the next `ahead` indices consumed in
        the background (see DyadPrefetchSampler)."""
        return DyadPrefetchSampler(self, sampler, ahead=ahead, window=window)

    def __getstate__(self):
        # Workers started with spawn get a copy without the parent's context.
        state = dict(self.__dict__)
        state["_dyad"] = None
        state["_dyad_pid"] = None
        return state


class DyadPrefetchSampler(torch.utils.data.Sampler):
    """Yields the indices of `sampler` (default: every index of `dataset` in
    order) and, from the first index on, consumes the samples of the next
    `ahead` indices in a background thread with Dyad.consume_many (`window`
    files in flight; 0: DYAD_CONSUME_WINDOW). Failures of the prefetch are
    left to __getitem__, which consumes the sample itself and raises."""

    def __init__(self, dataset, sampler=None, ahead=64, window=0):
        if ahead < 1:
            raise ValueError("DyadPrefetchSampler: ahead must be at least 1")
        self.dataset = dataset
        self.sampler = sampler if sampler is not None else range(len(dataset))
        self.ahead = int(ahead)
        self.window = int(window)
        self.prefetched = 0  # samples the background thread consumed (for tests)

    def __len__(self):
        return len(self.sampler)

    def _prefetch(self, todo):
        d = self.dataset.dyad
        while True:
            batch = [todo.get()]
            while batch[-1] is not None:
                try:
                    batch.append(todo.get_nowait())
                except queue.Empty:
                    break
            stop = batch[-1] is None
            paths = [self.dataset.path(i) for i in batch if i is not None]
            if paths:
                errors = d.consume_many(paths, window=self.window, raise_errors=False)
                self.prefetched += sum(1 for e in errors if e is None)
            if stop:
                return

    def __iter__(self):
        # A generator: nothing runs (no thread, no DYAD context) until the
        # loader asks for the first index, after it started its workers.
        todo = queue.Queue()
        thread = threading.Thread(target=self._prefetch, args=(todo,), daemon=True,
                                  name="dyad-prefetch")
        pending = collections.deque()
        it = iter(self.sampler)
        try:
            thread.start()
            exhausted = False
            while True:
                while not exhausted and len(pending) < self.ahead:
                    try:
                        i = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    pending.append(i)
                    todo.put(i)
                if not pending:
                    break
                yield pending.popleft()
            # Every index given: wait for the last prefetches, so that no
            # thread of ours is inside libdyad when the next epoch forks
            # its workers.
            todo.put(None)
            thread.join()
        finally:
            todo.put(None)  # stopped early: the thread ends after its batch
