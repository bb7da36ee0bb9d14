# SPDX-License-Identifier: Apache-2.0
"""An independent implementation of the DYAD wire protocol
(docs/wire-protocol.md), to send requests the real client never would."""
import hashlib
import hmac
import json
import os
import socket
import time
import struct

HDR = struct.Struct("<IHBBIiII")
MAGIC = 0x44415944
HELLO, REQUEST, RESPONSE, END, ERROR, CANCEL, UPDATE = 1, 2, 3, 4, 5, 6, 7
VERSION = 3
TAG_BYTES = 16
FLAG_TAG_DATA, FLAG_TAG_HEAD, TAG_HEAD = 0x01, 0x02, 12


def read_key(path):
    """The secret of a key file, as dyad reads it (trailing white space dropped)."""
    with open(path, "rb") as f:
        return f.read().rstrip(b" \t\r\n")


def _parts(label, parts):
    out = b""
    for p in (label, *parts):
        p = p.encode() if isinstance(p, str) else p
        out += struct.pack("<Q", len(p)) + p
    return out


def proof(secret, label, *parts):
    """HMAC-SHA-256 of the label and the parts, each length-prefixed (u64 LE), hex."""
    return hmac.new(secret, _parts(label, parts), hashlib.sha256).hexdigest()


def derive(secret, label, *parts):
    return hmac.new(secret, _parts(label, parts), hashlib.sha256).digest()


class Mac:
    """The tags of one direction: keyed BLAKE2b-128 of (sequence u64 LE, header, meta and the
    part of the data the header's flags name)."""

    def __init__(self, key):
        self.key, self.seq = key, 0

    def tag(self, header, meta):
        t = hashlib.blake2b(struct.pack("<Q", self.seq) + header + meta, key=self.key,
                            digest_size=TAG_BYTES).digest()
        self.seq += 1
        return t


def sock_endpoint(addr):
    host, port = addr[0], addr[1]
    if host.startswith("::ffff:"):
        host = host[7:]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def hello(sock_send, sock_recv, key=None, role="client", service_id=None, version=VERSION, expect=None,
          check_binding=True):
    """The hello exchange; returns the service's identity frame (or the
    error frame that refused us). With a key, the object the bound
    sock_send belongs to gets its tags (tx, rx) once admitted."""
    owner = getattr(sock_send, "__self__", None)
    meta = {"version": version, "pid": os.getpid(), "role": role}
    if service_id:
        meta["service_id"] = service_id
    if expect:
        meta["expect"] = expect
    if key:
        meta["nonce"] = os.urandom(32).hex()
    ch = json.dumps(meta).encode()
    sock_send(HELLO, 0, ch)
    f = sock_recv()
    if f["type"] != HELLO or not key or (f["meta"] or {}).get("auth", "none") == "none":
        return f
    secret = read_key(key) if isinstance(key, str) else key
    m = f["meta"]
    sc = m["challenge"].encode()
    if not hmac.compare_digest(m["proof"], proof(secret, "dyad service", ch, sc)):
        raise ConnectionError("the service did not prove it holds the key")
    challenge = json.loads(sc)
    sock = getattr(owner, "s", None)
    if check_binding and sock is not None and sock.family != socket.AF_UNIX:
        b = challenge["binding"]
        if b["peer"] != sock_endpoint(sock.getsockname()) or b["local"] != sock_endpoint(sock.getpeername()):
            raise ConnectionError(f"relayed connection: the service sees {b}")
    sock_send(HELLO, 0, {"proof": proof(secret, "dyad client", ch, sc, m["proof"])})
    if owner is not None:
        owner.tx = Mac(derive(secret, "dyad client to service", ch, sc))
        owner.rx = Mac(derive(secret, "dyad service to client", ch, sc))
    return sock_recv()


class Raw:
    def __init__(self, host=None, port=None, version=VERSION, hello=True, timeout=10, key=None, role="client",
                 service_id=None, unix_path=None, expect=None):
        if unix_path:
            self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.s.settimeout(timeout)
            self.s.connect(unix_path)
        else:
            self.s = socket.create_connection((host, port), timeout=timeout)
        self.version = version
        self.tag = 0
        self.tx = self.rx = None  # frame tags, once a keyed hello is done
        if hello:
            self.info = globals()["hello"](self.send, self.recv, key, role, service_id, version, expect)

    @classmethod
    def to(cls, node, **kw):
        """A connection to a harness node, with its cluster's key."""
        kw.setdefault("key", node.key)
        return cls(node.host, node.port, **kw)

    def frame(self, typ, tag, meta, data=b"", meta_len=None):
        """The bytes of one frame (tagged when the connection is keyed);
        meta_len, if given, is what the header claims."""
        m = meta if isinstance(meta, bytes) else (json.dumps(meta).encode() if meta is not None else b"")
        h = HDR.pack(MAGIC, self.version, typ, 0, tag, 0, len(m) if meta_len is None else meta_len, len(data))
        return h + m + (self.tx.tag(h, m) if self.tx else b"") + data

    def send(self, typ, tag, meta, data=b""):
        self.s.sendall(self.frame(typ, tag, meta, data))

    def _exact(self, n, fds=None):
        """n bytes; on a Unix socket, descriptors passed with them (SCM_RIGHTS)
        are appended to `fds` if given (else the kernel closes them)."""
        buf = b""
        while len(buf) < n:
            if fds is not None and self.s.family == socket.AF_UNIX:
                chunk, got, _, _ = socket.recv_fds(self.s, n - len(buf), 4)
                fds += got
            else:
                chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def recv(self):
        """The next frame; "fds": descriptors that came with its header (the
        caller closes them)."""
        fds = []
        h = self._exact(HDR.size, fds)
        magic, ver, typ, flags, tag, errnum, ml, dl = HDR.unpack(h)
        assert magic == MAGIC
        raw = self._exact(ml) if ml else b""
        data = b""
        if self.rx:
            mac = self._exact(TAG_BYTES)
            # The flags say how much of the data the tag covers too (a
            # compact answer's): all (1), its first TAG_HEAD bytes (2).
            covered = dl if flags & FLAG_TAG_DATA else (min(dl, TAG_HEAD) if flags & FLAG_TAG_HEAD else 0)
            data = self._exact(covered) if covered else b""
            if not hmac.compare_digest(mac, self.rx.tag(h, raw + data)):
                raise ConnectionError("a frame failed its tag")
        meta = json.loads(raw) if ml else None
        data += self._exact(dl - len(data)) if dl > len(data) else b""
        return {"type": typ, "tag": tag, "errnum": errnum, "meta": meta, "data": data, "version": ver, "fds": fds}

    def request(self, topic, **args):
        self.tag += 1
        args["topic"] = topic
        self.send(REQUEST, self.tag, args)
        return self.tag

    def collect(self, tag):
        """Frames of one answer until end or error: (final frame, data bytes)."""
        data = b""
        while True:
            f = self.recv()
            if f["tag"] != tag:
                continue
            data += f["data"]
            if f["type"] in (END, ERROR):
                return f, data

    def close(self):
        self.s.close()


class Stream:
    """A minimal FLUX_RPC consumer that reads data into one reused buffer
    (and can be told to read slowly), to load the service from one process."""

    def __init__(self, node, upath):
        self.s = socket.create_connection((node.host, node.port), timeout=120)
        self.buf = bytearray(1 << 20)
        self.bytes = 0
        self.tx = self.rx = None
        f = hello(self._send, self._meta_frame, node.key)
        if f["type"] != HELLO:
            raise ConnectionError(f"refused: {f['meta']}")
        self._send(REQUEST, 1, {"topic": "dyad.fetch", "upath": upath, "transport": "FLUX_RPC"})
        self.done = False
        self.error = None

    def _send(self, typ, tag, meta):
        m = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
        h = HDR.pack(MAGIC, VERSION, typ, 0, tag, 0, len(m), 0)
        self.s.sendall(h + m + (self.tx.tag(h, m) if self.tx else b""))

    def _head(self):
        """A frame's header and meta (its tag checked); returns (type, tag, errnum, meta bytes, data_len)."""
        h = bytearray(HDR.size)
        self._exact(memoryview(h))
        _, _, typ, _, tag, err, ml, dl = HDR.unpack(h)
        meta = bytearray(ml)
        self._exact(memoryview(meta))
        if self.rx:
            t = bytearray(TAG_BYTES)
            self._exact(memoryview(t))
            if not hmac.compare_digest(bytes(t), self.rx.tag(bytes(h), bytes(meta))):
                raise ConnectionError("a frame failed its tag")
        return typ, tag, err, meta, dl

    def _meta_frame(self):
        typ, tag, err, meta, dl = self._head()
        ml = len(meta)
        return {"type": typ, "tag": tag, "errnum": err, "meta": json.loads(meta) if ml else None}

    def _exact(self, view):
        got = 0
        while got < len(view):
            n = self.s.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("closed")
            got += n

    def _frame(self, rate=None):
        typ, tag, err, meta, dl = self._head()
        left = dl
        while left:
            n = min(left, len(self.buf) if rate is None else 65536)
            self._exact(memoryview(self.buf)[:n])
            left -= n
            self.bytes += n
            if rate:
                time.sleep(n / rate)  # not an ordering sleep: reads at `rate` bytes/s (a slow consumer)
        return typ, err

    def run(self, rate=None, stall_after=None, stall_s=0):
        try:
            stalled = False
            while True:
                if stall_after is not None and not stalled and self.bytes >= stall_after:
                    stalled = True
                    time.sleep(stall_s)  # not an ordering sleep: a consumer that stops reading a while
                typ, err = self._frame(rate)
                if typ == END:
                    self.done = True
                    return
                if typ == ERROR:
                    self.error = err
                    return
        except OSError as e:
            self.error = e
        finally:
            self.s.close()
