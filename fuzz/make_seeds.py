#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the hand-made seed inputs of fuzz/corpus/ (`seed-*` files).
Run once; inputs the fuzzer found are added beside them by `make fuzz-merge`
or by hand (`found-*`)."""
import base64
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def frame(ftype, tag, meta, errnum=0, data=b"", version=2, magic=0x44415944):
    m = json.dumps(meta, separators=(",", ":")).encode() if meta is not None else b""
    return struct.pack("<IHBBIiII", magic, version, ftype, 0, tag, errnum, len(m), len(data)) + m + data


def write(target, name, content):
    if isinstance(content, str):
        content = content.encode()
    with open(os.path.join(HERE, target, "seed-" + name), "wb") as f:
        f.write(content)


HELLO = {"version": 2, "pid": 4242, "role": "client"}
SVC_HELLO = {"version": 2, "pid": 4243, "role": "service", "service_id": "node1-4243",
             "nonce": "0123456789abcdef" * 4}
FETCH = {"topic": "dyad.fetch", "timeout_ms": 30000, "upath": "run/out.0.h5", "transport": "stream"}
UCX_FETCH = dict(FETCH, transport="ucx", ucx_worker=base64.b64encode(b"\x01\x02worker").decode(),
                 ucx_tag=7, ucx_consumer="c1", ucx_proto="put", ucx_window=140000000000,
                 ucx_window_size=4194304, ucx_rkey=base64.b64encode(b"rkey-bytes").decode())
PUBLISH = {"topic": "dyad.publish", "timeout_ms": 30000, "upath": "run/./a//b.dat", "ns": "dyad",
           "key_depth": 3, "key_bins": 1024}
RECORD = {"path": "run/out.0.h5", "owner": "node1-4243", "node": "node1", "producer_dir": "/tmp/prod",
          "endpoints": ["tcp://10.0.0.1:7420", "unix:/tmp/dyad.sock"], "size": 1048576,
          "mtime_ns": 1700000000123456789, "mode": 420, "ino": 1234567, "rank": 3}
PUT = {"topic": "kvs.put", "timeout_ms": 5000, "ns": "dyad", "key": "12.7.99.run/out.0.h5",
       "value": json.dumps(RECORD)}

# frame: whole client conversations and broken ones.
write("frame", "hello", frame(1, 0, HELLO))
write("frame", "hello-fetch-cancel", frame(1, 0, HELLO) + frame(2, 1, FETCH) + frame(6, 1, None))
write("frame", "publish-update", frame(2, 3, PUBLISH) + frame(7, 3, {"ack": 5}))
write("frame", "kvs-put", frame(2, 9, PUT))
write("frame", "error-answer", frame(5, 1, {"msg": "no such file", "rc": -13}, errnum=2))
write("frame", "response-data", frame(3, 1, {"size": 4}, data=b"abcd") + frame(4, 1, None))
write("frame", "bad-magic", frame(1, 0, HELLO, magic=0x50545448))
write("frame", "bad-version", frame(1, 0, HELLO, version=1))
write("frame", "bad-type", frame(9, 0, HELLO))
write("frame", "too-large", struct.pack("<IHBBIiII", 0x44415944, 2, 2, 0, 1, 0, 1 << 21, 0))
write("frame", "truncated", frame(2, 1, FETCH)[:40])
write("frame", "deep-json", frame(2, 1, None)[:16] + struct.pack("<II", 200, 0) + b"[" * 100 + b"]" * 100)

# hello: meta of the first frame.
write("hello", "client", json.dumps(HELLO))
write("hello", "service", json.dumps(SVC_HELLO))
write("hello", "proof", json.dumps({"proof": "ab" * 32, "nonce": "0123456789abcdef" * 4}))
write("hello", "refusal", json.dumps({"msg": "authentication required", "rc": -44}))
write("hello", "bad-nonce", json.dumps(dict(SVC_HELLO, nonce="xyz")))
write("hello", "long-id", json.dumps(dict(SVC_HELLO, service_id="s" * 300)))
write("hello", "not-object", "[1,2,3]")
write("hello", "not-json", "{\"version\":2,")

# request: request metas.
write("request", "fetch", json.dumps(FETCH))
write("request", "fetch-ucx", json.dumps(UCX_FETCH))
write("request", "fetch-escape", json.dumps(dict(FETCH, upath="a/../../etc/passwd")))
write("request", "fetch-reserved", json.dumps(dict(FETCH, upath="./.dyad/lock")))
write("request", "fetch-absolute", json.dumps(dict(FETCH, upath="/etc/passwd", transport="bogus")))
write("request", "publish", json.dumps(PUBLISH))
write("request", "publish-badbins", json.dumps(dict(PUBLISH, key_bins=0, key_depth=65)))
write("request", "kvs-put", json.dumps(PUT))
write("request", "kvs-put-services", json.dumps(dict(PUT, ns="dyad.services", key="svc-1")))
write("request", "kvs-get", json.dumps({"topic": "kvs.get", "ns": "dyad", "key": "k", "wait": True}))
write("request", "raw-upath", "sub/../f")

# record: values as the service puts them.
write("record", "full", json.dumps(RECORD))
write("record", "minimal", json.dumps({"path": "f", "owner": "s", "endpoints": [], "size": 0}))
write("record", "no-rank", json.dumps({k: v for k, v in RECORD.items() if k != "rank"}))
write("record", "wrong-types", json.dumps(dict(RECORD, size="big", endpoints=[1])))
write("record", "negative", json.dumps(dict(RECORD, size=-1, mode=-1, rank=-1)))
write("record", "not-object", "\"path\"")

# address: base64 blobs and service URIs.
write("address", "b64-worker", base64.b64encode(bytes(range(64))).decode())
write("address", "b64-pad1", base64.b64encode(b"ab").decode())
write("address", "b64-pad2", base64.b64encode(b"a").decode())
write("address", "b64-bad", "ab=c")
write("address", "uri-tcp", "tcp://10.0.0.1:7420")
write("address", "uri-ipv6", "tcp://[::1]:7420")
write("address", "uri-unix", "unix:/tmp/dyad.sock")
write("address", "uri-badport", "tcp://h:70000")
# A window key as UCX 1.13 packs it over tcp (ucx_peer's; MD map 1, host
# memory, an empty tcp key), and one that has a system device and distances.
write("address", "ucx-rkey-tcp", bytes.fromhex("01000000000000000000"))
write("address", "ucx-rkey-sysdev", bytes.fromhex("0500000000000000" "00" "00" "04aabbccdd" "03" "010203040506"))
# dyad.fetch_many: files of one owner, one of them escaping.
write("request", "fetch-many", json.dumps({"topic": "dyad.fetch_many", "transport": "FLUX_RPC",
                                           "files": [{"upath": "run/a", "generation": 4, "ns": "dyad", "key": "k"},
                                                     {"upath": "../b"}, 7]}))
