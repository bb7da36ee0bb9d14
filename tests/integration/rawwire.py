"""An independent implementation of the DYAD wire protocol
(docs/wire-protocol.md), to send requests the real client never would."""
import json
import socket
import struct

HDR = struct.Struct("<IHBBIiII")
MAGIC = 0x44415944
HELLO, REQUEST, RESPONSE, END, ERROR, CANCEL = 1, 2, 3, 4, 5, 6


class Raw:
    def __init__(self, host, port, version=1, hello=True, timeout=10):
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.version = version
        self.tag = 0
        if hello:
            self.send(HELLO, 0, {"version": version})
            self.info = self.recv()

    def send(self, typ, tag, meta, data=b""):
        m = json.dumps(meta).encode() if meta is not None else b""
        self.s.sendall(HDR.pack(MAGIC, self.version, typ, 0, tag, 0, len(m), len(data)) + m + data)

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def recv(self):
        magic, ver, typ, flags, tag, errnum, ml, dl = HDR.unpack(self._exact(HDR.size))
        assert magic == MAGIC
        meta = json.loads(self._exact(ml)) if ml else None
        data = self._exact(dl) if dl else b""
        return {"type": typ, "tag": tag, "errnum": errnum, "meta": meta, "data": data, "version": ver}

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
