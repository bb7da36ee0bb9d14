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
"""
import os

import numpy as np
import torch.utils.data

from .bindings import Dyad

__all__ = ["DyadDataset", "load_npy"]


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

    def __getstate__(self):
        # Workers started with spawn get a copy without the parent's context.
        state = dict(self.__dict__)
        state["_dyad"] = None
        state["_dyad_pid"] = None
        return state
