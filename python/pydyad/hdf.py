# SPDX-License-Identifier: Apache-2.0
"""DyadFile: an h5py.File that consumes before reading and produces on close."""
import os

import h5py

from .bindings import DyadError, DyadRC
from .context import get_default_dyad

__all__ = ["DyadFile", "CONSUME_MODES", "PRODUCE_MODES"]

CONSUME_MODES = ("r",)
PRODUCE_MODES = ("w", "w-", "x", "a", "r+")


class DyadFile(h5py.File):
    """h5py.File through DYAD.

    Mode "r": waits for the file to be produced and brings it here (dyad
    consume, or dyad_consume_w_metadata with metadata_wrapper) before opening.
    Modes "w", "w-", "x", "a", "r+": publishes the file (dyad produce) when it
    is closed with close() or at the end of a ``with`` block that did not
    raise. Paths outside the managed directories are opened as by h5py.

    fname is the path DYAD acts on; file, if given, is what h5py opens
    instead (e.g. a file object). dyad_ctx defaults to pydyad's module-global
    Dyad (created from the environment). Other keyword arguments go to
    h5py.File.
    """

    def __init__(self, fname, mode="r", file=None, dyad_ctx=None, metadata_wrapper=None, **kwargs):
        if mode not in CONSUME_MODES + PRODUCE_MODES:
            raise ValueError(f"DyadFile: invalid mode {mode!r} (use one of "
                             f"{', '.join(CONSUME_MODES + PRODUCE_MODES)})")
        self._dyad = None
        self._dyad_path = None
        self._dyad_mode = mode
        self._dyad_produced = False
        self._dyad_skip_produce = False
        if isinstance(fname, (str, bytes, os.PathLike)):
            self._dyad_path = os.path.abspath(os.path.expanduser(os.fsdecode(os.fspath(fname))))
            self._dyad = dyad_ctx if dyad_ctx is not None else get_default_dyad()
            if not self._dyad.initialized:
                raise DyadError(DyadRC.DYAD_RC_NOCTX, "the Dyad given as dyad_ctx is not initialised",
                                "DyadFile", self._dyad_path)
        if mode in CONSUME_MODES and self._dyad is not None and self._dyad.cons_path:
            if metadata_wrapper is not None:
                self._dyad.consume_w_metadata(self._dyad_path, metadata_wrapper)
            else:
                self._dyad.consume(self._dyad_path)
        super().__init__(file if file is not None else fname, mode, **kwargs)

    @property
    def dyad_mode(self):
        """The mode DyadFile was opened with (h5py's .mode says only r/r+)."""
        return self._dyad_mode

    def close(self):
        was_open = bool(self.id.valid)
        super().close()
        if (was_open and not self._dyad_produced and not self._dyad_skip_produce
                and self._dyad_mode in PRODUCE_MODES and self._dyad is not None and self._dyad.prod_path):
            self._dyad_produced = True
            self._dyad.produce(self._dyad_path)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._dyad_skip_produce = True  # do not publish a file whose writing failed
        return super().__exit__(exc_type, exc, tb)
