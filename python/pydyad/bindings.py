# SPDX-License-Identifier: Apache-2.0
"""ctypes bindings to DYAD's public C API (libdyad.so).

Only the public headers are relied on: ``dyad_ctx_t`` is opaque (a pointer),
``struct dyad_metadata`` is mirrored exactly as in
``include/dyad/client/dyad_client.h``.

libdyad keeps one context per process; every :class:`Dyad` object of a
process shares it. After ``fork()`` the child must not use connections
inherited from its parent, so a :class:`Dyad` used in a child process drops
the inherited context and initialises a new one with the same settings (see
:meth:`Dyad._check_fork`).
"""
import ast
import ctypes
import ctypes.util
import enum
import os
import platform
import re
import sys
import sysconfig
import threading

__all__ = [
    "Dyad",
    "DyadError",
    "DyadLibraryError",
    "DyadMetadata",
    "DyadMetadataWrapper",
    "DyadRC",
    "DTLMode",
    "DTLCommMode",
    "find_library",
    "install_dirs",
    "library_path",
    "load_library",
    "rc_name",
]


class DyadRC(enum.IntEnum):
    """Return codes of include/dyad/common/dyad_rc.h (same values as DYAD)."""

    DYAD_RC_OK = 0
    DYAD_RC_SYSFAIL = -1
    DYAD_RC_NOCTX = -1000
    DYAD_RC_BADMETADATA = -1001
    DYAD_RC_BADFIO = -1002
    DYAD_RC_BADMANAGEDPATH = -1003
    DYAD_RC_BADDTLMODE = -1004
    DYAD_RC_UNTRACKED = -1005
    DYAD_RC_BAD_B64DECODE = -1006
    DYAD_RC_BAD_COMM_MODE = -1007
    DYAD_RC_BAD_CLI_ARG_DEF = -1008
    DYAD_RC_BAD_CLI_PARSE = -1009
    DYAD_RC_BADBUF = -1010
    DYAD_RC_FLUXFAIL = -2000
    DYAD_RC_BADCOMMIT = -2001
    DYAD_RC_NOTFOUND = -2002
    DYAD_RC_BADFETCH = -2003
    DYAD_RC_BADRPC = -2004
    DYAD_RC_BADPACK = -2005
    DYAD_RC_BADUNPACK = -2006
    DYAD_RC_RPC_FINISHED = -2007
    DYAD_RC_TIMEOUT = -2008
    DYAD_RC_CONNFAIL = -2009
    DYAD_RC_BADCHECKSUM = -2010
    DYAD_RC_NOAUTH = -2011
    DYAD_RC_UCXINIT_FAIL = -3001
    DYAD_RC_UCXWAIT_FAIL = -3002
    DYAD_RC_UCXEP_FAIL = -3003
    DYAD_RC_UCXCOMM_FAIL = -3004
    DYAD_RC_UCXMMAP_FAIL = -3005
    DYAD_RC_UCXRKEY_PACK_FAILED = -3006
    DYAD_RC_UCXRKEY_UNPACK_FAILED = -3007
    DYAD_RC_MARGOINIT_FAIL = -4001
    DYAD_RC_MARGO_BAD_PROTO = -4002


def rc_name(rc):
    """Symbolic name of a DYAD return code ("DYAD_RC_UNKNOWN(<n>)" if unknown)."""
    try:
        return DyadRC(int(rc)).name
    except ValueError:
        return f"DYAD_RC_UNKNOWN({int(rc)})"


class DyadError(RuntimeError):
    """A DYAD call returned a negative code.

    ``rc`` is the integer code, ``rc_name`` its name (``DYAD_RC_NOTFOUND``...),
    ``message`` the explanation from ``dyad_last_error()``, ``call`` the C
    function, ``path`` the file concerned (or None).

    It survives pickling and being re-raised from one string, as PyTorch's
    DataLoader does with an error of a worker (``type(e)(text)``): the
    string is then the whole text (the worker's traceback included), and
    ``rc``, ``call`` and ``path`` are recovered from it where it names them.
    """

    _TEXT = re.compile(r"DyadError: (?P<call>\w+)(?:\((?P<path>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\))? "
                       r"failed: (?P<name>DYAD_RC_\w+(?:\(-?\d+\))?) \((?P<rc>-?\d+)\)")

    def __init__(self, rc=None, message="", call=None, path=None):
        if isinstance(rc, str) and not message and call is None and path is None:
            try:
                rc = int(rc)
            except ValueError:
                self._from_text(rc)
                return
        self.rc = int(rc) if rc is not None else -1
        self.rc_name = rc_name(self.rc)
        self.message = message or ""
        self.call = call
        self.path = path
        where = call or "dyad"
        if path is not None:
            where += f"({path!r})"
        text = f"{where} failed: {self.rc_name} ({self.rc})"
        if self.message:
            text += f": {self.message}"
        super().__init__(text)

    def _from_text(self, text):
        """Built from one string (a re-raise): keep it whole, learn what it names."""
        m = self._TEXT.search(text)
        self.rc = int(m.group("rc")) if m else -1
        self.rc_name = rc_name(self.rc)
        self.call = m.group("call") if m else None
        self.path = None
        if m and m.group("path"):
            try:
                self.path = ast.literal_eval(m.group("path"))
            except (ValueError, SyntaxError):
                self.path = m.group("path")[1:-1]
        self.message = text
        super().__init__(text)

    def __reduce__(self):  # picklable, e.g. across DataLoader workers
        return (_rebuild_dyad_error, (self.rc, self.message, self.call, self.path, str(self)))


def _rebuild_dyad_error(rc, message, call, path, text):
    e = DyadError(rc, message, call, path)
    if str(e) != text:  # built from one string: keep that string
        e = DyadError(text)
    return e


class DyadLibraryError(OSError):
    """libdyad.so could not be found or loaded."""


class DTLMode(enum.Enum):
    """Transport names accepted by dyad_init (DYAD_DTL_MODE)."""

    UCX = "UCX"
    MARGO = "MARGO"
    FLUX_RPC = "FLUX_RPC"
    STREAM = "STREAM"  # this implementation's alias of FLUX_RPC
    OFI = "OFI"  # alias of MARGO
    LOCAL = "LOCAL"
    AUTO = "AUTO"
    # The original pydyad's member names.
    DYAD_DTL_UCX = "UCX"
    DYAD_DTL_MARGO = "MARGO"
    DYAD_DTL_FLUX_RPC = "FLUX_RPC"


class CachePolicyMode(enum.Enum):
    """Cache policies (dyad_init's cache_policy, DYAD_CACHE_POLICY)."""
    DYAD_CACHE_NONE = "NONE"
    DYAD_CACHE_LRU = "LRU"
    DYAD_CACHE_FIFO = "FIFO"

    def __str__(self):
        return self.value


class DTLCommMode(enum.IntEnum):
    """dyad_dtl_comm_mode_t."""

    DYAD_COMM_NONE = 0
    DYAD_COMM_RECV = 1
    DYAD_COMM_SEND = 2
    DYAD_COMM_END = 3


class DyadCtx(ctypes.Structure):
    """Mirror of ``struct dyad_ctx`` (include/dyad/core/dyad_ctx.h), the
    original DYAD's layout, with upstream's 2026 fields at its end (read
    them only from a library that has them: ``Dyad.has_2026_api``).
    Read-only."""

    _fields_ = [
        ("h", ctypes.c_void_p),
        ("dtl_handle", ctypes.c_void_p),
        ("fname", ctypes.c_char_p),
        ("use_fs_locks", ctypes.c_bool),
        ("prod_real_path", ctypes.c_char_p),
        ("cons_real_path", ctypes.c_char_p),
        ("prod_managed_len", ctypes.c_uint32),
        ("cons_managed_len", ctypes.c_uint32),
        ("prod_real_len", ctypes.c_uint32),
        ("cons_real_len", ctypes.c_uint32),
        ("prod_managed_hash", ctypes.c_uint32),
        ("cons_managed_hash", ctypes.c_uint32),
        ("prod_real_hash", ctypes.c_uint32),
        ("cons_real_hash", ctypes.c_uint32),
        ("delim_len", ctypes.c_uint32),
        ("debug", ctypes.c_bool),
        ("check", ctypes.c_bool),
        ("reenter", ctypes.c_bool),
        ("initialized", ctypes.c_bool),
        ("shared_storage", ctypes.c_bool),
        ("async_publish", ctypes.c_bool),
        ("fsync_write", ctypes.c_bool),
        ("key_depth", ctypes.c_uint),
        ("key_bins", ctypes.c_uint),
        ("rank", ctypes.c_uint32),
        ("service_mux", ctypes.c_uint32),
        ("node_idx", ctypes.c_uint32),
        ("pid", ctypes.c_int32),
        ("kvs_namespace", ctypes.c_char_p),
        ("prod_managed_path", ctypes.c_char_p),
        ("cons_managed_path", ctypes.c_char_p),
        ("relative_to_managed_path", ctypes.c_bool),
        # Upstream DYAD's 2026 fields (a library without them, Dyad.has_2026_api
        # false, ends before these).
        ("cache_policy", ctypes.c_void_p),
        ("cache_policy_mode", ctypes.c_int),
        ("cache_capacity_bytes", ctypes.c_uint64),
        ("cache_low_watermark_frac", ctypes.c_double),
        ("cache_grace_period_sec", ctypes.c_uint),
        ("origin_path", ctypes.c_char_p),
    ]


RANK_UNKNOWN = 0xFFFFFFFF  # DYAD_RANK_UNKNOWN


def _ctx_struct(lib):
    p = lib.dyad_ctx_get()
    return ctypes.cast(p, ctypes.POINTER(DyadCtx)).contents if p else None


class DyadMetadata(ctypes.Structure):
    """Mirror of ``struct dyad_metadata`` (include/dyad/client/dyad_client.h)."""

    _fields_ = [
        ("fpath", ctypes.c_char_p),
        ("owner_rank", ctypes.c_uint32),
        ("owner_service", ctypes.c_char_p),
        ("owner_node", ctypes.c_char_p),
        ("size", ctypes.c_uint64),
        ("mtime_ns", ctypes.c_int64),
        ("generation", ctypes.c_uint64),
        ("record", ctypes.c_char_p),
    ]


_MetadataPtr = ctypes.POINTER(DyadMetadata)


def _dec(b):
    return None if b is None else os.fsdecode(b)


class DyadMetadataWrapper:
    """Metadata of a produced file, from :meth:`Dyad.get_metadata`.

    Attributes: ``fpath`` (path relative to the managed directory),
    ``owner_rank``, ``owner_service``, ``owner_node``, ``size``, ``mtime_ns``,
    ``generation``. It owns the C struct (needed by
    :meth:`Dyad.consume_w_metadata`) until :meth:`Dyad.free_metadata` or
    garbage collection frees it.
    """

    def __init__(self, ptr, lib):
        self._ptr = ptr
        self._lib = lib
        m = ptr.contents
        self.fpath = _dec(m.fpath)
        self.owner_rank = int(m.owner_rank)
        self.owner_service = _dec(m.owner_service)
        self.owner_node = _dec(m.owner_node)
        self.size = int(m.size)
        self.mtime_ns = int(m.mtime_ns)
        self.generation = int(m.generation)

    @property
    def freed(self):
        return not self._ptr

    def _free(self):
        if self._ptr:
            self._lib.dyad_free_metadata(ctypes.byref(self._ptr))
            self._ptr = _MetadataPtr()

    def __del__(self):
        try:
            self._free()
        except Exception:
            pass

    def as_dict(self):
        return {k: getattr(self, k) for k in
                ("fpath", "owner_rank", "owner_service", "owner_node", "size", "mtime_ns", "generation")}

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"DyadMetadataWrapper({fields}{', freed' if self.freed else ''})"


# ---------------------------------------------------------------------------
# Loading the library

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# A source checkout: python/pydyad/ beside build/ (after `make build`).
_RELATIVE_LIB = os.path.normpath(os.path.join(_PKG_DIR, "..", "..", "build", "lib", "libdyad.so"))
# What `cmake --install` puts in PREFIX/lib (or lib/<multiarch>): the
# run-time name first, then the development link.
_LIB_NAMES = ("libdyad.so.0", "libdyad.so")

_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def _package_prefix():
    """PREFIX when this package is installed as PREFIX/lib*/pythonX.Y/
    site-packages/pydyad (or .../python3/dist-packages/pydyad): where
    `pip install --prefix PREFIX` and `cmake --install build --prefix PREFIX`
    put their files."""
    site = os.path.dirname(_PKG_DIR)
    if os.path.basename(site) not in ("site-packages", "dist-packages"):
        return None
    pyver = os.path.dirname(site)
    libdir = os.path.dirname(pyver)
    if not os.path.basename(pyver).startswith("python") or not os.path.basename(libdir).startswith("lib"):
        return None
    return os.path.dirname(libdir)


def install_dirs():
    """Directories searched for an installed libdyad (after
    ctypes.util.find_library), in order: lib, lib/<multiarch> and lib64 of
    this package's install prefix, of sys.prefix (a virtual environment),
    sys.base_prefix, /usr/local and /usr (always last, as for the dynamic
    linker)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    prefixes = [p for p in (_package_prefix(), sys.prefix, sys.base_prefix, "/usr/local")
                if p and os.path.normpath(p) != "/usr"] + ["/usr"]
    out, seen = [], set()
    for prefix in prefixes:
        if not prefix:
            continue
        for sub in ("lib", os.path.join("lib", multiarch), "lib64"):
            d = os.path.join(prefix, sub)
            key = os.path.realpath(d)
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out


def _loaded_path(name):
    """Full path of the loaded library `name` (a bare soname found by the
    dynamic linker), from /proc/self/maps; `name` itself if unknown."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                if path and os.path.basename("/" + path) == name:
                    return "/" + path
    except OSError:
        pass
    return name


def find_library():
    """Where libdyad will be loaded from, in this order:

    1. ``$DYAD_LIBRARY`` (an explicit override: must exist);
    2. an installed copy: ``ctypes.util.find_library("dyad")`` (the dynamic
       linker's cache and paths), then libdyad.so.0 / libdyad.so in
       :func:`install_dirs` (the install prefix's lib directories);
    3. the build tree beside a source checkout: ../../build/lib/libdyad.so
       relative to this package.

    Returns a path (or, from find_library, a name the dynamic linker
    resolves). Raises DyadLibraryError listing every place it looked."""
    env = os.environ.get("DYAD_LIBRARY")
    if env:
        if not os.path.exists(env):
            raise DyadLibraryError(f"DYAD_LIBRARY={env!r}: no such file")
        return env
    found = ctypes.util.find_library("dyad")
    if found:
        return found
    tried = []
    for d in install_dirs():
        for name in _LIB_NAMES:
            p = os.path.join(d, name)
            if os.path.isfile(p):
                return p
        tried.append(d)
    if os.path.isfile(_RELATIVE_LIB):
        return _RELATIVE_LIB
    raise DyadLibraryError(
        "libdyad not found. Looked at, in order: $DYAD_LIBRARY (not set); "
        "ctypes.util.find_library('dyad') (nothing: not in the dynamic linker's cache or paths); "
        f"{' or '.join(_LIB_NAMES)} in {', '.join(tried)}; "
        f"the build tree beside this package ({_RELATIVE_LIB}). "
        "Set DYAD_LIBRARY to the library's path, or install DYAD "
        "(cmake --install build --prefix PREFIX) into one of those prefixes.")


_INIT_16 = [ctypes.c_bool, ctypes.c_bool, ctypes.c_bool, ctypes.c_bool, ctypes.c_bool,
            ctypes.c_bool, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_char_p,
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_bool, ctypes.c_char_p, ctypes.c_int,
            ctypes.c_void_p]
# cache capacity, policy, low watermark, grace period, origin path
_INIT_2026 = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_double, ctypes.c_uint, ctypes.c_char_p]
# A bytes object of n (> 1) bytes, not initialised, and the address of its
# bytes: written once by DYAD before anyone else sees the object.
_PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
_PyBytes_FromStringAndSize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_PyBytes_FromStringAndSize.restype = ctypes.py_object
_PyBytes_AsString = ctypes.pythonapi.PyBytes_AsString
_PyBytes_AsString.argtypes = [ctypes.py_object]
_PyBytes_AsString.restype = ctypes.c_void_p


def _new_bytes(n):
    return _PyBytes_FromStringAndSize(None, n)


def _bytes_address(b):
    return _PyBytes_AsString(b)


_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def _declare(lib):
    c_rc = ctypes.c_int
    ctx_p = ctypes.c_void_p
    sigs = {
        "dyad_ctx_get": ([], ctx_p),
        # dlsym finds the newest dyad_init: 21 arguments since 2026 (a library
        # with dyad_init_16), 16 before.
        "dyad_init": (_INIT_16 + (_INIT_2026 if hasattr(lib, "dyad_init_16") else []), c_rc),
        "dyad_init_env": ([ctypes.c_int, ctypes.c_void_p], c_rc),
        "dyad_finalize": ([], c_rc),
        "dyad_last_error": ([], ctypes.c_char_p),
        "dyad_produce": ([ctx_p, ctypes.c_char_p], c_rc),
        "dyad_get_metadata": ([ctx_p, ctypes.c_char_p, ctypes.c_bool, ctypes.POINTER(_MetadataPtr)], c_rc),
        "dyad_free_metadata": ([ctypes.POINTER(_MetadataPtr)], c_rc),
        "dyad_consume": ([ctx_p, ctypes.c_char_p], c_rc),
        "dyad_consume_w_metadata": ([ctx_p, ctypes.c_char_p, _MetadataPtr], c_rc),
    }
    for name, (argtypes, restype) in sigs.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise DyadLibraryError(f"{lib._name}: does not export {name}: not a DYAD library?") from None
        fn.argtypes = argtypes
        fn.restype = restype
    # Upstream's 2026 API (an older libdyad lacks it: consume_range then
    # says so).
    fn = getattr(lib, "dyad_consume_range_into", None)
    if fn is not None:  # the bytes straight into a Python object's memory
        fn.argtypes = [ctx_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_size_t)]
        fn.restype = c_rc
    fn = getattr(lib, "dyad_consume_range", None)
    if fn is not None:
        fn.argtypes = [ctx_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        fn.restype = c_rc
    # New in this implementation (an older libdyad lacks it: consume_many
    # then says so).
    fn = getattr(lib, "dyad_consume_many", None)
    if fn is not None:
        fn.argtypes = [ctx_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_uint,
                       ctypes.POINTER(c_rc), _ConsumeDoneFn, ctypes.c_void_p]
        fn.restype = c_rc


# dyad_consume_done_fn: (arg, index, rc, error or NULL)
_ConsumeDoneFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p)


def load_library():
    """Loads (once) and returns libdyad as a ctypes.CDLL."""
    global _lib, _lib_path
    with _lib_lock:
        if _lib is None:
            path = find_library()
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                raise DyadLibraryError(f"cannot load {path}: {e}") from e
            _declare(lib)
            _lib, _lib_path = lib, path if os.sep in path else _loaded_path(path)
        return _lib


def library_path():
    """Path of the loaded libdyad (None before the first Dyad is created)."""
    return _lib_path


# ---------------------------------------------------------------------------
# Fork handling: libdyad's context (and its pooled connections) belongs to the
# process that created it.

_ctx_pid = None  # pid of the process that created the live libdyad context
_ctx_paths = None  # (producer, consumer) directories of the context pydyad created
_state_lock = threading.RLock()


def _after_fork_in_child():
    global _state_lock
    _state_lock = threading.RLock()  # another thread may have held it at fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _drop_inherited(lib):
    """Called with _state_lock held: in a child after fork(), finalise the
    context inherited from the parent. Its connections are copies of the
    parent's sockets; finalising only closes this process's descriptors."""
    global _ctx_pid, _ctx_paths
    if _ctx_pid is not None and _ctx_pid != os.getpid():
        lib.dyad_finalize()
        _ctx_pid = None
        _ctx_paths = None


def _fspath(fname):
    b = fname if isinstance(fname, bytes) else os.fsencode(os.fspath(fname))
    if b"\0" in b:
        raise ValueError(f"embedded null byte in path {fname!r}")
    return b


class Dyad:
    """DYAD's Python interface (same methods as the original pydyad.Dyad).

    libdyad has one context per process: every Dyad object of a process
    shares it, and init()/init_env() are no-ops (as in C) when it exists,
    unless reinit is set. Every method raises :class:`DyadError` when the C
    call returns a negative code.

    ``prod_path`` / ``cons_path`` are the managed directories of the
    context (None when not set), as pydyad knows them.
    """

    def __init__(self):
        self._lib = load_library()
        self._init_args = None  # ("init", kwargs) or ("init_env", kwargs)
        self._pid = None
        self.initialized = False
        self.prod_path = None
        self.cons_path = None

    # -- errors ---------------------------------------------------------
    def _check(self, rc, call, path=None):
        if rc < 0:
            msg = self._lib.dyad_last_error()
            raise DyadError(rc, _dec(msg) if msg else "", call, path)
        return rc

    # -- context --------------------------------------------------------
    @property
    def ctx(self):
        """The process's opaque dyad_ctx_t* (an int address), or None."""
        return self._ctx_for_call()

    def _ctx_for_call(self):
        self._check_fork()
        return self._lib.dyad_ctx_get()

    @property
    def rank(self):
        """This node's rank (``ctx->rank``: its service's, the numbering of
        ``owner_rank`` in metadata), or None while it is not known."""
        self._check_fork()
        c = _ctx_struct(self._lib)
        return None if c is None or c.rank == RANK_UNKNOWN else int(c.rank)

    def _check_fork(self):
        """In a child process after fork(), drop the context inherited from the
        parent and, if this object was initialised in another process,
        initialise again with the same settings."""
        pid = os.getpid()
        if _ctx_pid in (None, pid) and (not self.initialized or self._pid == pid):
            return  # the common case, without taking the lock
        with _state_lock:
            _drop_inherited(self._lib)
            if self.initialized and self._pid != pid:
                kind, kwargs = self._init_args
                self.initialized = False
                getattr(self, kind)(**kwargs)

    def _initialise(self, kind, kwargs, call):
        """Runs call() (dyad_init or dyad_init_env) and records the outcome."""
        global _ctx_pid, _ctx_paths
        with _state_lock:
            _drop_inherited(self._lib)
            self._check(call(), "dyad_" + kind)
            # The directories in effect, from the context itself (a no-op
            # init leaves the existing ones).
            c = _ctx_struct(self._lib)
            _ctx_paths = (_dec(c.prod_managed_path), _dec(c.cons_managed_path)) if c else (None, None)
            _ctx_pid = os.getpid()
            self._init_args = (kind, kwargs)
            self._pid = os.getpid()
            self.initialized = True
            self.prod_path, self.cons_path = _ctx_paths

    def init(self, debug=False, check=False, shared_storage=False, reinit=False,
             async_publish=False, fsync_write=False, key_depth=3, key_bins=1024,
             service_mux=1, kvs_namespace=None, prod_managed_path=None,
             cons_managed_path=None, relative_to_managed_path=False, dtl_mode=None,
             dtl_comm_mode=DTLCommMode.DYAD_COMM_RECV, flux_handle=None,
             cache_capacity_bytes=0, cache_policy=None, cache_low_watermark=0.8,
             cache_grace_period_sec=5, origin_path=None):
        """dyad_init with explicit values (flux_handle is accepted and
        ignored). Settings the C function does not take (DYAD_SERVICE_URI,
        DYAD_WAIT_TIMEOUT, DYAD_LOG_LEVEL...) come from the environment. As in
        C, a no-op if the process already has a context and reinit is False.
        The last five are upstream's since 2026 (a library from before them
        takes their values from the environment)."""
        if isinstance(dtl_mode, DTLMode):
            dtl_mode = dtl_mode.value
        kwargs = dict(debug=debug, check=check, shared_storage=shared_storage, reinit=reinit,
                      async_publish=async_publish, fsync_write=fsync_write,
                      key_depth=key_depth, key_bins=key_bins, service_mux=service_mux,
                      kvs_namespace=kvs_namespace, prod_managed_path=prod_managed_path,
                      cons_managed_path=cons_managed_path,
                      relative_to_managed_path=relative_to_managed_path, dtl_mode=dtl_mode,
                      dtl_comm_mode=dtl_comm_mode, cache_capacity_bytes=cache_capacity_bytes,
                      cache_policy=cache_policy, cache_low_watermark=cache_low_watermark,
                      cache_grace_period_sec=cache_grace_period_sec, origin_path=origin_path)
        if isinstance(cache_policy, CachePolicyMode):
            cache_policy = cache_policy.value

        def s(v):
            return None if v is None else _fspath(v)

        def call():
            args = [bool(debug), bool(check), bool(shared_storage), bool(reinit),
                    bool(async_publish), bool(fsync_write), int(key_depth), int(key_bins),
                    int(service_mux), s(kvs_namespace), s(prod_managed_path),
                    s(cons_managed_path), bool(relative_to_managed_path), s(dtl_mode),
                    int(dtl_comm_mode), None]
            if self.has_2026_api:
                args += [int(cache_capacity_bytes), s(cache_policy), float(cache_low_watermark),
                         int(cache_grace_period_sec), s(origin_path)]
            return self._lib.dyad_init(*args)

        self._initialise("init", kwargs, call)

    def init_env(self, dtl_comm_mode=DTLCommMode.DYAD_COMM_RECV, flux_handle=None):
        """dyad_init_env: initialise from DYAD's environment variables
        (flux_handle is accepted and ignored)."""
        self._initialise("init_env", dict(dtl_comm_mode=dtl_comm_mode),
                         lambda: self._lib.dyad_init_env(int(dtl_comm_mode), None))

    def finalize(self):
        """dyad_finalize: tears the process's context down (for every Dyad
        object of the process, as there is only one)."""
        global _ctx_pid, _ctx_paths
        with _state_lock:
            self._check(self._lib.dyad_finalize(), "dyad_finalize")
            _ctx_pid = None
            _ctx_paths = None
            self.initialized = False
            self._init_args = None

    # -- produce / consume ------------------------------------------------
    def produce(self, fname):
        """Publishes fname (under the producer-managed directory; other paths
        are ignored)."""
        ctx = self._ctx_for_call()
        self._check(self._lib.dyad_produce(ctx, _fspath(fname)), "dyad_produce", os.fspath(fname))

    def consume(self, fname):
        """Waits for fname to be produced, then brings it into the
        consumer-managed directory (unmanaged paths are ignored)."""
        ctx = self._ctx_for_call()
        self._check(self._lib.dyad_consume(ctx, _fspath(fname)), "dyad_consume", os.fspath(fname))

    def consume_many(self, fnames, window=0, on_done=None, raise_errors=True):
        """Consumes many files with up to ``window`` in flight (0:
        DYAD_CONSUME_WINDOW): lookups batched, fetches overlapped, each file
        whole and checked as by consume. Every file waits at most
        DYAD_WAIT_TIMEOUT from the start of the call.

        on_done(fname, error) is called as each file finishes (any order, on
        a thread of libdyad's; error is None or a DyadError). Returns one
        entry per name, in order: None or the file's DyadError. With
        raise_errors (the default), the first failure of the list is raised
        once every file has finished instead."""
        names = [os.fspath(f) for f in fnames]
        if getattr(self._lib, "dyad_consume_many", None) is None:
            raise DyadLibraryError(f"{library_path()}: no dyad_consume_many (an older libdyad)")
        ctx = self._ctx_for_call()
        n = len(names)
        arr = (ctypes.c_char_p * max(n, 1))(*[_fspath(f) for f in names])
        rcs = (ctypes.c_int * max(n, 1))()
        errors = [None] * n

        def done(_arg, index, rc, error):
            if rc < 0:
                errors[index] = DyadError(rc, _dec(error) if error else "", "dyad_consume_many", names[index])
            if on_done is not None:
                on_done(names[index], errors[index])

        cb = _ConsumeDoneFn(done)
        rc = self._lib.dyad_consume_many(ctx, arr, n, int(window or 0), rcs, cb, None)
        for i in range(n):  # codes of files the callback did not see (it always should)
            if rcs[i] < 0 and errors[i] is None:
                errors[i] = DyadError(rcs[i], "", "dyad_consume_many", names[i])
        if rc < 0 and not any(errors):
            self._check(rc, "dyad_consume_many")
        if raise_errors:
            for e in errors:
                if e is not None:
                    raise e
        return errors

    def get_metadata(self, fname, should_wait=False, raw=False):
        """Metadata of fname (a consumer-managed path). Without waiting, a file
        not produced yet gives None (as the original pydyad; last_error()
        says why); with waiting, DYAD_WAIT_TIMEOUT bounds the wait
        (DyadError DYAD_RC_TIMEOUT). Other failures raise DyadError.

        Returns a DyadMetadataWrapper, or with raw=True the ctypes
        POINTER(DyadMetadata) that the caller must pass to free_metadata."""
        ctx = self._ctx_for_call()
        ptr = _MetadataPtr()
        rc = self._lib.dyad_get_metadata(ctx, _fspath(fname), bool(should_wait), ctypes.byref(ptr))
        if rc == DyadRC.DYAD_RC_NOTFOUND and not should_wait:
            return None
        self._check(rc, "dyad_get_metadata", os.fspath(fname))
        if raw:
            return ptr
        return DyadMetadataWrapper(ptr, self._lib)

    def free_metadata(self, metadata):
        """Frees metadata from get_metadata (a wrapper or a raw pointer).
        Freeing twice is harmless."""
        if metadata is None:
            return
        if isinstance(metadata, DyadMetadataWrapper):
            metadata._free()
            return
        if isinstance(metadata, _MetadataPtr):
            self._check(self._lib.dyad_free_metadata(ctypes.byref(metadata)), "dyad_free_metadata")
            return
        raise TypeError(f"free_metadata: expected metadata from get_metadata, got {type(metadata).__name__}")

    def consume_w_metadata(self, fname, metadata):
        """As consume, with metadata from get_metadata (no lookup, no wait),
        or built by hand (a ctypes structure or pointer whose first fields
        are ``fpath`` and ``owner_rank``: then DYAD reads only those, checks
        fpath against fname and looks the file up). metadata=None means
        "local": nothing to do, as in DYAD."""
        if isinstance(metadata, DyadMetadataWrapper):
            if metadata.freed:
                raise DyadError(DyadRC.DYAD_RC_BADMETADATA, "the metadata was already freed",
                                "dyad_consume_w_metadata", os.fspath(fname))
            ptr = metadata._ptr
        elif metadata is None:
            ptr = _MetadataPtr()
        elif isinstance(metadata, _MetadataPtr):
            ptr = metadata
        elif isinstance(metadata, ctypes.Structure):
            # Built by hand (fpath relative to the managed directory,
            # owner_rank), as code written for the original pydyad does.
            ptr = ctypes.cast(ctypes.pointer(metadata), _MetadataPtr)
        elif isinstance(metadata, ctypes._Pointer):
            ptr = ctypes.cast(metadata, _MetadataPtr)
        else:
            raise TypeError("consume_w_metadata: expected metadata from get_metadata or a ctypes "
                            f"structure with fpath and owner_rank, got {type(metadata).__name__}")
        ctx = self._ctx_for_call()
        self._check(self._lib.dyad_consume_w_metadata(ctx, _fspath(fname), ptr),
                    "dyad_consume_w_metadata", os.fspath(fname))

    def consume_range(self, fname, offset, length):
        """Bytes [offset, offset + length) of fname as ``bytes``, without a
        local copy of the file (dyad_consume_range): read in place when the
        file is on this node already, else only the range is fetched from its
        owner, over any transport. Waits for fname to be produced. A range
        past the end of the file raises DyadError (DYAD_RC_BADFIO); length 0
        gives b"". Unlike the original pydyad's, this never returns None."""
        fn = getattr(self._lib, "dyad_consume_range", None)
        if fn is None:
            raise DyadLibraryError(f"{library_path()}: has no dyad_consume_range (an older libdyad)")
        if offset < 0 or length < 0:
            raise ValueError("consume_range: offset and length must not be negative")
        ctx = self._ctx_for_call()
        size = ctypes.c_size_t()
        into = getattr(self._lib, "dyad_consume_range_into", None)
        if into is not None and length > 1:
            # As os.pread does: a new bytes object, its memory not yet
            # initialised, filled in place (no copy, no second buffer). Sizes
            # 0 and 1 are shared objects in CPython: those take the copy.
            out = _new_bytes(int(length))
            self._check(into(ctx, _fspath(fname), int(offset), int(length),
                             ctypes.c_void_p(_bytes_address(out)), ctypes.byref(size)),
                        "dyad_consume_range_into", os.fspath(fname))
            return out
        data = ctypes.c_void_p()
        self._check(fn(ctx, _fspath(fname), int(offset), int(length), ctypes.byref(data),
                       ctypes.byref(size)), "dyad_consume_range", os.fspath(fname))
        try:
            return ctypes.string_at(data.value, size.value) if size.value else b""
        finally:
            _libc.free(data)

    @property
    def has_2026_api(self):
        """Does the loaded libdyad have upstream's 2026 API (dyad_init with
        21 arguments, dyad_consume_range, the grown struct dyad_ctx)?"""
        return hasattr(self._lib, "dyad_init_16")

    # -- helpers ------------------------------------------------------------
    def last_error(self):
        """dyad_last_error() of the calling thread."""
        msg = self._lib.dyad_last_error()
        return _dec(msg) if msg else ""

    def __repr__(self):
        state = "initialised" if self.initialized else "not initialised"
        return f"<pydyad.Dyad {state} producer={self.prod_path!r} consumer={self.cons_path!r}>"
