# SPDX-License-Identifier: Apache-2.0
"""A data loader written the way code for the original DYAD is: its own
ctypes mirror of struct dyad_ctx and dyad_metadata (the original pydyad's
field lists), the libraries found by their original names, and the DLIO
readers' rule: owner_rank == ctx->rank means the file is local, read it in
place; else fetch it with dyad_consume_w_metadata.

At load it binds, as upstream's current pydyad does (its pull request #183,
July 2026), every function that pydyad binds, with the same argument and
result types and the grown struct dyad_ctx: a library missing one fails
here (AttributeError), as upstream's pydyad does.

Usage: ctypes_loader.py produce|load|range N DIR. Prints one JSON line.
range: dyad_init with upstream's 21 arguments (directory and transport from
the environment), then dyad_consume_range of three ranges of each file."""
import ctypes
import ctypes.util
import json
import os
import sys


class Ctx(ctypes.Structure):
    _fields_ = [
        ("h", ctypes.c_void_p), ("dtl_handle", ctypes.c_void_p), ("fname", ctypes.c_char_p),
        ("use_fs_locks", ctypes.c_bool), ("prod_real_path", ctypes.c_char_p),
        ("cons_real_path", ctypes.c_char_p), ("prod_managed_len", ctypes.c_uint32),
        ("cons_managed_len", ctypes.c_uint32), ("prod_real_len", ctypes.c_uint32),
        ("cons_real_len", ctypes.c_uint32), ("prod_managed_hash", ctypes.c_uint32),
        ("cons_managed_hash", ctypes.c_uint32), ("prod_real_hash", ctypes.c_uint32),
        ("cons_real_hash", ctypes.c_uint32), ("delim_len", ctypes.c_uint32),
        ("debug", ctypes.c_bool), ("check", ctypes.c_bool), ("reenter", ctypes.c_bool),
        ("initialized", ctypes.c_bool), ("shared_storage", ctypes.c_bool),
        ("async_publish", ctypes.c_bool), ("fsync_write", ctypes.c_bool),
        ("key_depth", ctypes.c_uint), ("key_bins", ctypes.c_uint), ("rank", ctypes.c_uint32),
        ("service_mux", ctypes.c_uint32), ("node_idx", ctypes.c_uint32), ("pid", ctypes.c_int32),
        ("kvs_namespace", ctypes.c_char_p), ("prod_managed_path", ctypes.c_char_p),
        ("cons_managed_path", ctypes.c_char_p), ("relative_to_managed_path", ctypes.c_bool),
        # upstream's 2026 fields
        ("cache_policy", ctypes.c_void_p), ("cache_policy_mode", ctypes.c_int),
        ("cache_capacity_bytes", ctypes.c_uint64), ("cache_low_watermark_frac", ctypes.c_double),
        ("cache_grace_period_sec", ctypes.c_uint), ("origin_path", ctypes.c_char_p),
    ]


class Metadata(ctypes.Structure):
    _fields_ = [("fpath", ctypes.c_char_p), ("owner_rank", ctypes.c_uint32)]


def load(name):
    found = ctypes.util.find_library(name)
    if found is None:
        sys.exit(f"cannot find lib{name}.so")
    return ctypes.CDLL(found)


client, ctxlib = load("dyad_client"), load("dyad_ctx")
CtxP, MdP = ctypes.POINTER(Ctx), ctypes.POINTER(Metadata)
B, U, S, I, V = ctypes.c_bool, ctypes.c_uint, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p
# (library, name, argtypes, restype): what upstream's pydyad binds when it loads.
for lib, name, argtypes, restype in [
        (ctxlib, "dyad_ctx_init", [I, V], None),
        (ctxlib, "dyad_ctx_get", [], CtxP),
        (ctxlib, "dyad_init", [B, B, B, B, B, B, U, U, U, S, S, S, B, S, I, V,
                               ctypes.c_uint64, S, ctypes.c_double, U, S], I),
        (ctxlib, "dyad_init_env", [I, V], I),
        (client, "dyad_produce", [CtxP, S], I),
        (client, "dyad_get_metadata", [CtxP, S, B, ctypes.POINTER(MdP)], I),
        (client, "dyad_free_metadata", [ctypes.POINTER(MdP)], I),
        (client, "dyad_consume", [CtxP, S], I),
        (client, "dyad_consume_w_metadata", [CtxP, S, MdP], I),
        (client, "dyad_consume_range", [CtxP, S, ctypes.c_size_t, ctypes.c_size_t,
                                        ctypes.POINTER(V), ctypes.POINTER(ctypes.c_size_t)], I),
        (ctxlib, "dyad_finalize", [], I)]:
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, restype
client.dyad_ctx_get.restype = ctypes.c_void_p
libc = ctypes.CDLL(None)  # range buffers are freed with libc's free(), as upstream's pydyad does
libc.free.argtypes = [V]

role, n, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "range":
    mode = os.environ.get("DYAD_DTL_MODE")
    if ctxlib.dyad_init(False, False, False, False, False, False, 3, 1024, 1, None, None,
                        directory.encode(), False, mode.encode() if mode else None, 1, None,
                        32 << 20, b"FIFO", 0.5, 9, None) != 0:
        sys.exit("dyad_init (21 arguments) failed")
elif ctxlib.dyad_init_env(1, None) != 0:
    sys.exit("dyad_init_env failed")
ctx = ctxlib.dyad_ctx_get()
c = ctx.contents
out = {"rank": c.rank, "node_idx": c.node_idx, "key_depth": c.key_depth, "key_bins": c.key_bins,
       "prod": c.prod_managed_path and c.prod_managed_path.decode(),
       "cons": c.cons_managed_path and c.cons_managed_path.decode(),
       # one library, one context, whichever name loaded it
       "same_ctx": client.dyad_ctx_get()
       == ctypes.addressof(c),
       "local": [], "fetched": [], "handmade": [],
       "cache": [c.cache_policy_mode, c.cache_capacity_bytes, c.cache_low_watermark_frac,
                 c.cache_grace_period_sec, c.origin_path], "ranges": []}
for i in range(n):
    if role == "range":
        path = os.path.join(directory, f"s{i}.bin").encode()
        size = 1000 + i
        for off, length in [(0, 1), (size - 1, 1), (17, 500), (size, 0), (size - 1, 2)]:
            data, got = V(), ctypes.c_size_t()
            rc = client.dyad_consume_range(ctx, path, off, length, ctypes.byref(data), ctypes.byref(got))
            ok = rc == 0 and ctypes.string_at(data.value, got.value) == bytes([i % 256]) * length
            out["ranges"].append([off, length, rc, got.value, ok])
            if rc == 0:
                libc.free(data)
        continue
    path = os.path.join(directory, f"s{i}.bin")
    if role == "produce":
        with open(path, "wb") as f:
            f.write(bytes([i % 256]) * (1000 + i))
        assert client.dyad_produce(ctx, path.encode()) == 0, path
        continue
    md = MdP()
    assert client.dyad_get_metadata(ctx, path.encode(), True, ctypes.byref(md)) == 0, path
    if md.contents.owner_rank == ctx.contents.rank:
        out["local"].append(i)  # the DLIO rule: read in place
    elif i % 2:
        # metadata built by hand, as loaders that keep their own index do
        mine = Metadata(fpath=f"s{i}.bin".encode(), owner_rank=md.contents.owner_rank)
        assert client.dyad_consume_w_metadata(ctx, path.encode(), ctypes.pointer(mine)) == 0, path
        out["handmade"].append(i)
    else:
        assert client.dyad_consume_w_metadata(ctx, path.encode(), md) == 0, path
        out["fetched"].append(i)
    assert client.dyad_free_metadata(ctypes.byref(md)) == 0
    with open(path, "rb") as f:
        assert f.read() == bytes([i % 256]) * (1000 + i), path
print(json.dumps(out))
