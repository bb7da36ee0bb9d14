# SPDX-License-Identifier: Apache-2.0
"""A peer that takes what it can from a dyadd and gives nothing back, as a
process of its own (tests/integration/test_peer_caps.py starts it).

    attacker.py MODE --host H --port P [--source IP] [--unix PATH] [--key F] [-n N] [--upath U]

MODE:
  connections  open N connections (hello done) and keep them
  local        N LOCAL fetches of U on one Unix-socket connection, never confirmed
  stream       N FLUX_RPC fetches of U, one connection each, never read
  margo        N MARGO fetches of U on one connection, never acknowledged
  slowloris    N connections to an HTTP port (--port) that each send half a
               request and then nothing (--flood: header lines without end
               instead), each reopened as soon as the service drops it

It prints one JSON line when it holds what it could get
({"held": n, "refused": [messages]}), then keeps it until its stdin closes
or it is killed. --source binds the TCP connections to that local address:
another host, as far as the service can tell."""
import argparse
import json
import os
import socket
import sys
import time

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


def slowloris(a):
    """N threads, each holding one connection with half a request in it
    (or an endless flood of header lines), reopened whenever the service
    drops it. Returns how many were open at once after the first round."""
    import threading
    opened = [threading.Event() for _ in range(a.n)]
    line = b"X-Pad: " + b"a" * 200 + b"\r\n"

    def loop(i):
        while True:
            try:
                s = socket.create_connection((a.host, a.port), timeout=30)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: dyadd\r\n")
                opened[i].set()
                if a.flood:
                    while True:
                        s.sendall(line)
                else:
                    s.recv(1)  # until the service drops it
            except OSError:
                pass
            try:
                s.close()
            except (OSError, UnboundLocalError):
                pass
            time.sleep(0.02)  # not an ordering sleep: a pause before reconnecting (no spin when refused)

    for i in range(a.n):
        threading.Thread(target=loop, args=(i,), daemon=True).start()
    for e in opened:
        e.wait(10)
    return sum(e.is_set() for e in opened)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["connections", "local", "stream", "margo", "fill", "waits", "scrape",
                                     "slowloris"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--source")
    p.add_argument("--unix")
    p.add_argument("--key")
    p.add_argument("-n", type=int, default=1)
    p.add_argument("--upath", default="")
    p.add_argument("--sources", default="", help="fill, scrape: comma-separated source addresses")
    p.add_argument("--pad", type=int, default=0, help="waits: bytes of ignored JSON per request")
    p.add_argument("--ns", default="dyad")
    p.add_argument("--key-size", type=int, default=16)
    p.add_argument("--flood", action="store_true", help="slowloris: header lines, as fast as taken")
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
    elif a.mode == "fill":
        # From each source address in turn, connections until one is
        # refused (an error frame, or closed at once): what a local user who
        # binds 127.0.0.2..9 can take.
        for src in a.sources.split(","):
            for _ in range(a.n):
                try:
                    a.source = src
                    r = connect(a)
                    keep.append(r)
                    ok = r.info["type"] == HELLO
                except Exception as e:  # closed at once: EOF in the hello
                    ok, r = False, None
                    refused.append(f"{src}: {type(e).__name__}: {e}")
                if ok:
                    held += 1
                    continue
                if r is not None:
                    refused.append(r.info["meta"]["msg"])
                break
    elif a.mode == "waits":
        # n waits for a record that never comes, on one connection, each
        # padded with `pad` bytes of JSON the handler never reads.
        r = connect(a)
        keep.append(r)
        item = "x" * 62
        pad = [item] * max(1, a.pad // (len(item) + 4))  # "item", as json.dumps writes it
        for i in range(a.n):
            r.tag += 1
            r.send(2, r.tag, {"topic": "kvs.get", "ns": a.ns, "key": f"absent-{i}".ljust(a.key_size, "k"),
                              "wait": True, "pad": pad})
        r.s.settimeout(2)
        try:
            while True:  # refusals come at once; waits are not answered
                f = r.recv()
                if f["type"] == ERROR:
                    refused.append(f["meta"]["msg"])
                else:
                    held += 1
        except (socket.timeout, TimeoutError):
            pass
        held = a.n - len(refused)
    elif a.mode == "scrape":
        # n keep-alive connections to the metrics endpoint (--port), each
        # asking GET /metrics again as soon as it has its answer.
        import http.client
        import threading
        answered = [threading.Event() for _ in range(a.n)]

        srcs = [x for x in a.sources.split(",") if x]

        def loop(i):
            src = (srcs[i % len(srcs)], 0) if srcs else None  # several hosts, as the service sees it
            c = http.client.HTTPConnection(a.host, a.port, timeout=30, source_address=src)
            keep.append(c)
            while True:
                try:
                    c.request("GET", "/metrics")
                    c.getresponse().read()
                    answered[i].set()
                except Exception:  # closed: open another, as a scraper would
                    c.close()
                    time.sleep(0.01)

        for i in range(a.n):
            threading.Thread(target=loop, args=(i,), daemon=True).start()
        for e in answered:
            e.wait(30)
        held = sum(e.is_set() for e in answered)
    elif a.mode == "slowloris":
        held = slowloris(a)
    print(json.dumps({"held": held, "refused": refused}), flush=True)
    sys.stdin.read()  # until the test lets go (or kills us)


if __name__ == "__main__":
    main()
