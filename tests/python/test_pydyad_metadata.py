# SPDX-License-Identifier: Apache-2.0
"""get_metadata (with and without waiting), consume_w_metadata, free_metadata."""
import os
import time

from pydyad import DyadRC
from pydyad_testlib import finish, last_json, run_py, spawn_py

REPORT = """
def md(m):
    return {k: getattr(m, k) for k in ("fpath", "owner_rank", "owner_service", "owner_node",
                                        "size", "mtime_ns", "generation")}
"""


def produce_file(node, rel, data):
    path = node.path(rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    run_py(node, f"d = Dyad(); d.init_env(); d.produce({path!r})")
    return path


def test_metadata_fields_then_consume_w_metadata(cluster):
    prod, cons = cluster[0], cluster[1]
    data = os.urandom(100_000)
    ppath = produce_file(prod, "sub/m.bin", data)
    cpath = cons.path("sub/m.bin")
    out = last_json(run_py(cons, defs=REPORT, code=f"""
        d = Dyad(); d.init_env()
        m = d.get_metadata({cpath!r})
        first = md(m)
        again = md(d.get_metadata({cpath!r}, should_wait=True))
        present_before = os.path.exists({cpath!r})
        d.consume_w_metadata({cpath!r}, m)
        d.free_metadata(m)
        d.free_metadata(m)            # twice: harmless
        try:
            d.consume_w_metadata({cpath!r}, m)
            after_free = None
        except DyadError as e:
            after_free = e.rc
        raw = d.get_metadata({cpath!r}, raw=True)
        raw_fields = [raw.contents.fpath.decode(), raw.contents.size, raw.contents.generation]
        d.consume_w_metadata({cpath!r}, raw)
        d.free_metadata(raw)
        print(json.dumps({{"md": first, "again": again, "present_before": present_before,
                          "after_free": after_free, "raw": raw_fields, "raw_null": not raw}}))
    """).stdout)
    m = out["md"]
    assert m["fpath"] == "sub/m.bin"
    assert m["owner_service"] == "node0" and m["owner_node"] == "node0"
    assert m["size"] == len(data)
    assert m["mtime_ns"] == os.stat(ppath).st_mtime_ns
    assert m["generation"] == 1
    assert isinstance(m["owner_rank"], int)
    assert out["again"] == m
    assert out["present_before"] is False, "get_metadata alone must not move the file"
    with open(cpath, "rb") as f:
        assert f.read() == data
    assert out["after_free"] == DyadRC.DYAD_RC_BADMETADATA
    assert out["raw"] == ["sub/m.bin", len(data), 1]
    assert out["raw_null"] is True
    st = prod.status()["counters"]
    assert st["served"] == 1 and st["bytes_sent"] == len(data)


def test_not_produced_without_waiting_is_none_at_once(cluster):
    """As the original pydyad: get_metadata(should_wait=False) of a file not
    produced yet is None; last_error() says why."""
    cons = cluster[1]
    t0 = time.monotonic()
    out = last_json(run_py(cons, f"""
        d = Dyad(); d.init_env()
        m = d.get_metadata({cons.path('later.bin')!r})
        print(json.dumps([m is None, d.last_error()]))
    """).stdout)   # no DYAD_WAIT_TIMEOUT: waiting would block forever
    assert out[0] is True
    assert "has not been produced" in out[1]
    assert time.monotonic() - t0 < 20


def test_waiting_get_metadata_returns_when_produced(cluster):
    prod, cons = cluster[0], cluster[1]
    waiter = spawn_py(cons, defs=REPORT, code=f"""
        d = Dyad(); d.init_env()
        t0 = time.monotonic()
        m = d.get_metadata({cons.path('w/late.bin')!r}, should_wait=True)
        print(json.dumps(dict(md(m), waited=time.monotonic() - t0)))
    """, DYAD_WAIT_TIMEOUT=60)
    cons.wait_waiters(1, procs=[waiter])
    # Not an ordering sleep: the produce comes at least 0.5 s after the wait
    # began, so `waited >= 0.5` below shows get_metadata waited for it.
    time.sleep(0.5)
    assert waiter.poll() is None, "get_metadata(should_wait=True) must wait for the produce"
    produce_file(prod, "w/late.bin", b"late" * 1000)
    out = last_json(finish(waiter, timeout=60)[0])
    assert out["fpath"] == "w/late.bin" and out["size"] == 4000 and out["generation"] == 1
    assert out["waited"] >= 0.5
    assert not os.path.exists(cons.path("w/late.bin"))


def test_waiting_get_metadata_times_out(cluster):
    cons = cluster[1]
    t0 = time.monotonic()
    out = last_json(run_py(cons, f"""
        d = Dyad(); d.init_env()
        try:
            d.get_metadata({cons.path('never.bin')!r}, should_wait=True)
            print(json.dumps(None))
        except DyadError as e:
            print(json.dumps([e.rc, e.rc_name, e.message]))
    """, DYAD_WAIT_TIMEOUT=1).stdout)
    assert out[0] == DyadRC.DYAD_RC_TIMEOUT == -2008
    assert out[1] == "DYAD_RC_TIMEOUT" and "DYAD_WAIT_TIMEOUT" in out[2]
    assert 1.0 <= time.monotonic() - t0 < 30


def test_reproduce_bumps_generation(cluster):
    prod, cons = cluster[0], cluster[1]
    produce_file(prod, "g.bin", b"one")
    produce_file(prod, "g.bin", b"two, longer")
    out = last_json(run_py(cons, defs=REPORT, code=f"""
        d = Dyad(); d.init_env()
        m = d.get_metadata({cons.path('g.bin')!r})
        d.consume_w_metadata({cons.path('g.bin')!r}, m)
        print(json.dumps(md(m)))
    """).stdout)
    assert out["generation"] == 2 and out["size"] == len(b"two, longer")
    with open(cons.path("g.bin"), "rb") as f:
        assert f.read() == b"two, longer"


def test_consume_w_metadata_none_means_local(cluster):
    cons = cluster[1]
    run_py(cons, f"d = Dyad(); d.init_env(); d.consume_w_metadata({cons.path('local.bin')!r}, None)")
    assert not os.path.exists(cons.path("local.bin"))
