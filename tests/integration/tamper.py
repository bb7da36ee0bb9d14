# SPDX-License-Identifier: Apache-2.0
"""An on-path attacker without the job's key, invisible to the hello's
binding: it passes every connection between a client and a dyadd on byte
for byte, with the same addresses on both sides, and changes one byte in
the data part of the service's compact answers (docs/wire-protocol.md),
where their metadata travels:

- fetch_many: a file of dyad.fetch_many's compact answer (no meta): the
  low bit of its index, so file 0's bytes come as file 1's and back;
- get_many: kvs.get_many's compact answer: the last digit of a record's
  "size";
- list: kvs.list's compact answer: the last byte of its data.

It is two processes, each in a network namespace of its own, as a router
that rewrites TCP segments would be (test_channel.py sets them up): the
front holds the service's address toward the client and accepts there; the
back holds the client's address toward the service and connects from the
client's very port. They talk over a Unix socket (namespaces share the
file system). Client and service each see the same pair of addresses, so
only the frames' tags can tell. Every frame changed prints one JSON line
{"tampered": MODE} (back).

    tamper.py MODE front --listen IP:PORT --via PATH
    tamper.py MODE back --via PATH --service IP:PORT --source IP
"""
import argparse
import json
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rawwire import END, HDR, RESPONSE, TAG_BYTES  # noqa: E402

lock = threading.Lock()


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def pump(src, dst):
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            dst.sendall(b)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def meta_of(raw):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def tamper(mode, typ, meta, data):
    """The data, changed if this frame is one of MODE's compact answers."""
    m = meta_of(meta)
    if mode == "fetch_many" and typ == RESPONSE and not meta and len(data) >= 12:
        return bytes([data[0] ^ 1]) + data[1:]
    raw = isinstance(m, dict) and m.get("format") == "raw" and typ == END and data
    if mode == "get_many" and raw and "more" not in m:
        at = data.find(b'"size":')
        if at < 0:
            return data
        end = at + len(b'"size":')
        while end < len(data) and data[end:end + 1].isdigit():
            end += 1
        last = data[end - 1]
        return data[:end - 1] + bytes([last + 1 if last < ord("9") else last - 1]) + data[end:]
    if mode == "list" and raw and "more" in m:
        return data[:-1] + bytes([data[-1] ^ 1])
    return data


def service_to_client(mode, up, down):
    """Frames from the service: the first (the hello's challenge) has no
    tag; every later one has."""
    try:
        k = 0
        while True:
            h = read_exact(up, HDR.size)
            _, _, typ, _, _, _, ml, dl = HDR.unpack(h)
            meta = read_exact(up, ml) if ml else b""
            tag = read_exact(up, TAG_BYTES) if k > 0 else b""
            data = read_exact(up, dl) if dl else b""
            k += 1
            changed = tamper(mode, typ, meta, data)
            if changed != data:
                with lock:
                    print(json.dumps({"tampered": mode}), flush=True)
            down.sendall(h + meta + tag + changed)
    except (OSError, ConnectionError, struct.error):
        pass
    for s in (up, down):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def front(a):
    host, port = a.listen.rsplit(":", 1)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(16)
    print(json.dumps({"listening": a.listen}), flush=True)
    while True:
        c, peer = srv.accept()
        d = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        d.connect(a.via)
        d.sendall(json.dumps({"port": peer[1]}).encode() + b"\n")
        threading.Thread(target=pump, args=(c, d), daemon=True).start()
        threading.Thread(target=pump, args=(d, c), daemon=True).start()


def back(a):
    host, port = a.service.rsplit(":", 1)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(a.via)
    srv.listen(16)
    print(json.dumps({"listening": a.via}), flush=True)
    while True:
        c, _ = srv.accept()
        line = b""
        while not line.endswith(b"\n"):
            line += c.recv(1)
        d = socket.socket()
        d.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        d.bind((a.source, json.loads(line)["port"]))  # the client's own address and port
        d.connect((host, int(port)))
        threading.Thread(target=pump, args=(c, d), daemon=True).start()
        threading.Thread(target=service_to_client, args=(a.mode, d, c), daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["fetch_many", "get_many", "list"])
    p.add_argument("side", choices=["front", "back"])
    p.add_argument("--listen")
    p.add_argument("--via", required=True)
    p.add_argument("--service")
    p.add_argument("--source")
    a = p.parse_args()
    (front if a.side == "front" else back)(a)


if __name__ == "__main__":
    main()
