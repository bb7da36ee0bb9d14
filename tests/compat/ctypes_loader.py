# SPDX-License-Identifier: Apache-2.0
"""A data loader written the way code for the original DYAD is: its own
ctypes mirror of struct dyad_ctx and dyad_metadata (the original pydyad's
field lists), the libraries found by their original names, and the DLIO
readers' rule: owner_rank == ctx->rank means the file is local, read it in
place; else fetch it with dyad_consume_w_metadata.

Usage: ctypes_loader.py produce|load N DIR. Prints one JSON line."""
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
    ]


class Metadata(ctypes.Structure):
    _fields_ = [("fpath", ctypes.c_char_p), ("owner_rank", ctypes.c_uint32)]


def load(name):
    found = ctypes.util.find_library(name)
    if found is None:
        sys.exit(f"cannot find lib{name}.so")
    return ctypes.CDLL(found)


client, ctxlib = load("dyad_client"), load("dyad_ctx")
ctxlib.dyad_ctx_get.restype = ctypes.POINTER(Ctx)
client.dyad_ctx_get.restype = ctypes.c_void_p
ctxlib.dyad_init_env.argtypes = [ctypes.c_int, ctypes.c_void_p]
MdP = ctypes.POINTER(Metadata)
client.dyad_produce.argtypes = [ctypes.POINTER(Ctx), ctypes.c_char_p]
client.dyad_get_metadata.argtypes = [ctypes.POINTER(Ctx), ctypes.c_char_p, ctypes.c_bool, ctypes.POINTER(MdP)]
client.dyad_free_metadata.argtypes = [ctypes.POINTER(MdP)]
client.dyad_consume_w_metadata.argtypes = [ctypes.POINTER(Ctx), ctypes.c_char_p, MdP]

role, n, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if ctxlib.dyad_init_env(1, None) != 0:
    sys.exit("dyad_init_env failed")
ctx = ctxlib.dyad_ctx_get()
c = ctx.contents
out = {"rank": c.rank, "node_idx": c.node_idx, "key_depth": c.key_depth, "key_bins": c.key_bins,
       "prod": c.prod_managed_path and c.prod_managed_path.decode(),
       "cons": c.cons_managed_path and c.cons_managed_path.decode(),
       # one library, one context, whichever name loaded it
       "same_ctx": client.dyad_ctx_get()
       == ctypes.addressof(c),
       "local": [], "fetched": [], "handmade": []}
for i in range(n):
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
