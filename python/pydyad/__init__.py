# SPDX-License-Identifier: Apache-2.0
"""pydyad: Python interface to DYAD (ctypes over libdyad.so's public C API).

    from pydyad import Dyad, dyad_open
    with dyad_open("/local/out/x.npy", "wb") as f:   # produced on close
        f.write(data)

Optional modules: ``pydyad.hdf`` (DyadFile, needs h5py) and ``pydyad.torch``
(DyadDataset, needs PyTorch and numpy).
"""
from .bindings import (Dyad, DyadError, DyadLibraryError, DyadMetadata, DyadMetadataWrapper,
                       DyadRC, CachePolicyMode, DTLCommMode, DTLMode, find_library, load_library, rc_name)
from .context import dyad_open, get_default_dyad, set_default_dyad
from ._version import __version__

__all__ = [
    "Dyad", "DyadError", "DyadLibraryError", "DyadMetadata", "DyadMetadataWrapper", "DyadRC",
    "CachePolicyMode", "DTLCommMode", "DTLMode", "dyad_open", "find_library", "get_default_dyad", "load_library",
    "rc_name", "set_default_dyad", "__version__",
]
