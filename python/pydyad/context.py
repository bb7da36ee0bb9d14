"""dyad_open: open() that consumes before reading and produces after writing."""
import io
import os
import threading
from contextlib import contextmanager

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


@contextmanager
def dyad_open(*args, dyad_ctx=None, metadata_wrapper=None, register_dyad_ctx=False, **kwargs):
    """Context manager with open()'s arguments.

    Before opening in a read mode, waits for the file to be produced and
    brings it here (dyad consume; with metadata_wrapper from
    Dyad.get_metadata, dyad_consume_w_metadata). After closing a file opened
    in a writing mode, publishes it (dyad produce), unless the block raised.
    DYAD acts only on paths under the consumer/producer-managed directories;
    other files are opened as by open().

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
    f = io.open(*args, **kwargs)
    try:
        yield f
    finally:
        f.close()
    if produce and dyad is not None and dyad.prod_path:
        dyad.produce(path)
