# SPDX-License-Identifier: Apache-2.0
"""dyad_open: open() that consumes before reading and produces after writing."""
import io
import os
import threading
import warnings

from .bindings import Dyad, DyadError, DyadRC

__all__ = ["dyad_open", "get_default_dyad", "set_default_dyad", "mode_actions"]

_default = None
_default_lock = threading.Lock()


def get_default_dyad():
    """The module-global Dyad, created with init_env() on first use."""
    global _default
    with _default_lock:
        if _default is None:
            d = Dyad()
            d.init_env()
            _default = d
        return _default


def set_default_dyad(dyad_ctx):
    """Makes dyad_ctx the module-global Dyad (None: recreate from env on next use)."""
    global _default
    with _default_lock:
        _default = dyad_ctx


def mode_actions(mode):
    """(consume_before_open, produce_after_close) for an open() mode string.

    Read modes ('r', 'rb', 'rt', 'r+', ...) consume; modes that write
    ('w', 'a', 'x' or '+', in text or binary) produce. Raises ValueError for
    a mode open() would refuse."""
    if not isinstance(mode, str):
        raise TypeError(f"open() mode must be str, not {type(mode).__name__}")
    chars = set(mode)
    kinds = [c for c in mode if c in "rwax"]
    if (len(kinds) != 1 or not chars <= set("rwaxbt+") or len(chars) != len(mode)
            or ("b" in chars and "t" in chars)):
        raise ValueError(f"invalid mode: {mode!r}")
    kind = kinds[0]
    return kind == "r", kind in "wax" or "+" in chars


def _split_args(args, kwargs):
    if args:
        file = args[0]
    elif "file" in kwargs:
        file = kwargs["file"]
    else:
        raise TypeError("dyad_open() missing required argument 'file' (pos 1)")
    if len(args) > 1:
        mode = args[1]
    else:
        mode = kwargs.get("mode", "r")
    return file, mode


class _Publication:
    """The produce owed when a file opened for writing is closed: done once,
    by the object dyad_open returned (or the layer detach() handed over), and
    only after its close() succeeded; cancelled when the ``with`` block
    raised or the file was never closed (garbage-collected while open)."""

    def __init__(self, dyad, path):
        self.dyad = dyad
        self.path = path

    def cancel(self):
        self.dyad = None

    def fire(self):
        dyad, self.dyad = self.dyad, None
        if dyad is not None and dyad.prod_path:
            dyad.produce(self.path)


class _Producing:
    """Mixed into the io classes of a file that dyad_open opened for writing.
    Only the outermost layer (``_dyad_pub`` set) publishes."""

    _dyad_pub = None

    def close(self):
        pub = self._dyad_pub
        if pub is None or self.closed:
            return super().close()
        try:
            super().close()
        except BaseException:
            pub.cancel()  # flushing or closing failed: the file may be incomplete
            raise
        self._dyad_pub = None
        pub.fire()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self._dyad_pub is not None:
            self._dyad_pub.cancel()  # the block raised: close without producing
        self.close()

    def __del__(self):
        # Never closed: not published (as when the with block raises).
        pub = self._dyad_pub
        if pub is not None:
            pub.cancel()
        super().__del__()

    def detach(self):
        inner = super().detach()
        if self._dyad_pub is not None and isinstance(inner, _Producing):
            inner._dyad_pub, self._dyad_pub = self._dyad_pub, None
        return inner


class DyadFileIO(_Producing, io.FileIO):
    pass


class DyadBufferedWriter(_Producing, io.BufferedWriter):
    pass


class DyadBufferedRandom(_Producing, io.BufferedRandom):
    pass


class DyadTextIOWrapper(_Producing, io.TextIOWrapper):
    pass


def _open_producing(pub, file, mode="r", buffering=-1, encoding=None, errors=None, newline=None,
                    closefd=True, opener=None):
    """io.open() for the writing modes, building the same layers (raw file,
    buffer, text) from subclasses whose outermost layer produces on close."""
    binary = "b" in mode
    if binary:
        for name, value in (("encoding", encoding), ("errors", errors), ("newline", newline)):
            if value is not None:
                raise ValueError(f"binary mode doesn't take an {name} argument")
        if buffering == 1:
            warnings.warn("line buffering (buffering=1) isn't supported in binary mode, the default "
                          "buffer size will be used", RuntimeWarning, 3)
    raw = DyadFileIO(file, mode.replace("b", "").replace("t", ""), closefd, opener=opener)
    layers = [raw]
    try:
        line_buffering = False
        if buffering == 1 or (buffering < 0 and raw.isatty()):
            buffering, line_buffering = -1, True
        if buffering < 0:
            buffering = io.DEFAULT_BUFFER_SIZE
            try:
                blksize = os.fstat(raw.fileno()).st_blksize
                if blksize > 1:
                    buffering = blksize
            except (OSError, AttributeError):
                pass
        if buffering == 0:
            if not binary:
                raise ValueError("can't have unbuffered text I/O")
        else:
            cls = DyadBufferedRandom if "+" in mode else DyadBufferedWriter
            layers.append(cls(raw, buffering))
            if not binary:
                text = DyadTextIOWrapper(layers[-1], encoding, errors, newline, line_buffering)
                text.mode = mode
                layers.append(text)
    except BaseException:
        raw.close()
        raise
    layers[-1]._dyad_pub = pub
    return layers[-1]


def dyad_open(*args, dyad_ctx=None, metadata_wrapper=None, register_dyad_ctx=False, **kwargs):
    """open() through DYAD: same arguments, returns a file object, usable
    with or without ``with``.

    Before opening in a read mode, waits for the file to be produced and
    brings it here (dyad consume; with metadata_wrapper from
    Dyad.get_metadata, dyad_consume_w_metadata). A file opened in a writing
    mode is published (dyad produce) when it is closed: by close(), or at the
    end of a ``with`` block, unless the block raised. A file that is never
    closed is not published. DYAD acts only on paths under the
    consumer/producer-managed directories; other files are opened as by
    open().

    dyad_ctx: the Dyad to use (default: a module-global one created from the
    environment on first use); register_dyad_ctx=True makes dyad_ctx that
    module-global Dyad.
    """
    file, mode = _split_args(args, kwargs)
    consume, produce = mode_actions(mode)
    if register_dyad_ctx and dyad_ctx is not None:
        set_default_dyad(dyad_ctx)
    path = None
    if isinstance(file, (str, bytes, os.PathLike)):
        path = os.path.abspath(os.path.expanduser(os.fspath(file)))
    dyad = None
    if path is not None:
        dyad = dyad_ctx if dyad_ctx is not None else get_default_dyad()
        if not dyad.initialized:
            raise DyadError(DyadRC.DYAD_RC_NOCTX, "the Dyad given as dyad_ctx is not initialised: "
                            "call its init() or init_env() first", "dyad_open", path)
    # The C API ignores unmanaged paths; only skip the calls when no
    # directory of that kind is configured at all (the C call would then
    # refuse with DYAD_RC_BADMANAGEDPATH).
    if consume and dyad is not None and dyad.cons_path:
        if metadata_wrapper is not None:
            dyad.consume_w_metadata(path, metadata_wrapper)
        else:
            dyad.consume(path)
    if produce and dyad is not None and dyad.prod_path:
        return _open_producing(_Publication(dyad, path), *args, **kwargs)
    return io.open(*args, **kwargs)
