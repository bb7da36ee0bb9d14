# SPDX-License-Identifier: Apache-2.0
"""A peer that takes what it can from a dyadd and gives nothing back, as a
process of its own (tests/integration/test_peer_caps.py starts it).

    attacker.py MODE --host H --port P [--source IP] [--unix PATH] [--key F] [-n N] [--upath U]

MODE:
  connections  open N connections (hello done) and keep them
  local        N LOCAL fetches of U on one Unix-socket connection, never confirmed
  stream       N FLUX_RPC fetches of U, one connection each, never read
  margo        N MARGO fetches of U on one connection, never acknowledged

It prints one JSON line when it holds what it could get
({"held": n, "refused": [messages]}), then keeps it until its stdin closes
or it is killed. --source binds the TCP connections to that local address:
another host, as far as the service can tell."""
import argparse
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rawwire import ERROR, HELLO, VERSION, Raw  # noqa: E402


def connect(a, hello=True):
    if a.unix:
        return Raw(unix_path=a.unix, key=a.key, hello=hello, timeout=30)
    if not a.source:
        return Raw(a.host, a.port, key=a.key, hello=hello, timeout=30)
    r = Raw.__new__(Raw)
    r.s = socket.create_connection((a.host, a.port), timeout=30, source_address=(a.source, 0))
    r.version = VERSION
    r.tag = 0
    r.tx = r.rx = None
    if hello:
        from rawwire import hello as do_hello
        r.info = do_hello(r.send, r.recv, a.key, "client", None, VERSION)
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["connections", "local", "stream", "margo"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--source")
    p.add_argument("--unix")
    p.add_argument("--key")
    p.add_argument("-n", type=int, default=1)
    p.add_argument("--upath", default="")
    a = p.parse_args()
    held, refused, keep = 0, [], []

    if a.mode == "connections":
        for _ in range(a.n):
            r = connect(a)
            keep.append(r)
            if r.info["type"] == HELLO:
                held += 1
            else:
                refused.append(r.info["meta"]["msg"])
    elif a.mode in ("local", "margo"):
        r = connect(a)
        keep.append(r)
        args = {"upath": a.upath, "transport": "LOCAL" if a.mode == "local" else "MARGO"}
        if a.mode == "margo":
            args["ofi_proto"] = os.environ.get("DYAD_MARGO_PROTO", "ofi+tcp")
        tags = [r.request("dyad.fetch", **args) for _ in range(a.n)]
        answered = set()
        while len(answered) < len(tags):  # the first frame of each: its answer or its refusal
            f = r.recv()
            for fd in f.get("fds", []):
                keep.append(fd)  # hold the passed descriptor too
            if f["tag"] in answered:
                continue
            answered.add(f["tag"])
            if f["type"] == ERROR:
                refused.append(f["meta"]["msg"])
            else:
                held += 1
    elif a.mode == "stream":
        for _ in range(a.n):
            r = connect(a)
            keep.append(r)
            r.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            r.request("dyad.fetch", upath=a.upath, transport="FLUX_RPC")
            held += 1  # never read: the service must not wait on us
    print(json.dumps({"held": held, "refused": refused}), flush=True)
    sys.stdin.read()  # until the test lets go (or kills us)


if __name__ == "__main__":
    main()
